// The rm_proto_library macro produces message code, imports across files, and a gRPC
// service that really serves calls.
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/testdata/echo.grpc.pb.h"
#include "proto/testdata/echo.pb.h"

namespace ringmaster {
namespace {

class EchoService final : public testdata::Echo::CallbackService {
  grpc::ServerUnaryReactor* Say(grpc::CallbackServerContext* context,
                                const testdata::EchoRequest* request,
                                testdata::EchoReply* reply) override {
    *reply->mutable_payload() = request->payload();
    reply->set_times(2);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(ProtoLibrary, MessagesRoundTripThroughTheWire) {
  testdata::EchoRequest request;
  request.mutable_payload()->set_text("ring");
  request.mutable_payload()->add_numbers(42);
  std::string wire = request.SerializeAsString();
  testdata::EchoRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.payload().text(), "ring");
  EXPECT_EQ(parsed.payload().numbers(0), 42);
}

TEST(ProtoLibrary, GrpcServiceAnswersOverLoopback) {
  EchoService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = testdata::Echo::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  testdata::EchoRequest request;
  request.mutable_payload()->set_text("hello");
  testdata::EchoReply reply;
  grpc::Status status = stub->Say(&context, request, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.payload().text(), "hello");
  EXPECT_EQ(reply.times(), 2);
  server->Shutdown();
}

}  // namespace
}  // namespace ringmaster
