#!/usr/bin/env bash
# The coordinator's transport security, end to end with ringmaster and ringctl:
#   - TLS with a server certificate (a CA made here with openssl): a client that trusts the
#     CA gets through; a plaintext client and one without the CA do not;
#   - bearer tokens: no token and a wrong token are refused (UNAUTHENTICATED /
#     PERMISSION_DENIED), the right one passes;
#   - mutual TLS: with --tls_client_ca, a client without a certificate is refused and one
#     with a certificate signed by that CA gets through;
#   - listening beyond loopback without tokens is refused with a message naming the flags.
set -uo pipefail
BIN="$TEST_SRCDIR/ringmaster"
RINGMASTER="$BIN/coordinator/ringmaster"
RINGCTL="$BIN/cli/ringctl"
WORK="${TEST_TMPDIR:-/tmp}/tls_test"
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done' EXIT

# A CA, a server certificate for 127.0.0.1, a client certificate.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=ringmaster test CA" \
  -keyout ca.key -out ca.pem 2>/dev/null || { echo "openssl failed"; exit 1; }
cat >san.cnf <<CNF
subjectAltName = IP:127.0.0.1, DNS:localhost
CNF
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.cnf -out server.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=a user" -keyout client.key -out client.csr 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -out client.pem 2>/dev/null
echo user-token >user.token
echo node-token >node.token
echo wrong >wrong.token

# start NAME EXTRA_FLAGS...: a coordinator on a port the kernel picks (port 0, so tests
# running side by side never collide); sets PORT to it.
start() {
  local name="$1"
  shift
  "$RINGMASTER" --listen "127.0.0.1:0" --db "$WORK/db-$name.db" --user_token_file user.token \
    --node_token_file node.token --tls_cert server.pem --tls_key server.key "$@" \
    >"ringmaster-$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    if grep -q "serving on" "ringmaster-$name.log"; then
      PORT="$(grep -o "(port [0-9]*)" "ringmaster-$name.log" | tail -1 | tr -dc 0-9)"
      return 0
    fi
    sleep 0.05
  done
  fail "ringmaster did not start: $(tail -3 "ringmaster-$name.log")"
  exit 1
}
start tls
C="--coordinator 127.0.0.1:$PORT"
"$RINGCTL" list $C --token_file user.token --tls_ca ca.pem >ok.out 2>&1 ||
  fail "TLS with the CA and the user token was refused: $(cat ok.out)"
"$RINGCTL" list $C --token_file user.token >plain.out 2>&1 &&
  fail "a plaintext client got through a TLS server"
"$RINGCTL" list $C --tls_ca ca.pem >notoken.out 2>&1 && fail "no token got through"
grep -q "user token" notoken.out || fail "no-token message: $(cat notoken.out)"
"$RINGCTL" list $C --token_file wrong.token --tls_ca ca.pem >wrong.out 2>&1 && fail "a wrong token got through"
grep -qi "wrong user token" wrong.out || fail "wrong-token message: $(cat wrong.out)"
"$RINGCTL" list $C --token_file node.token --tls_ca ca.pem >node.out 2>&1 &&
  fail "the node token was accepted as a user token"

# Mutual TLS.
start mtls --tls_client_ca ca.pem
M="--coordinator 127.0.0.1:$PORT"
"$RINGCTL" list $M --token_file user.token --tls_ca ca.pem >nocert.out 2>&1 &&
  fail "mutual TLS let in a client without a certificate"
"$RINGCTL" list $M --token_file user.token --tls_ca ca.pem --tls_client_cert client.pem \
  --tls_client_key client.key >mtls.out 2>&1 || fail "mutual TLS refused a good client: $(cat mtls.out)"

# Beyond loopback without tokens: refused before serving.
"$RINGMASTER" --listen 0.0.0.0:0 --db "$WORK/open.db" >open.out 2>&1
[ $? -eq 2 ] || fail "listening on 0.0.0.0 without tokens was not refused"
grep -q -- "--user_token_file" open.out || fail "the refusal does not name the flags: $(cat open.out)"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "PASS: tls"
