#!/usr/bin/env bash
# The coordinator's transport security, end to end with ringmaster and ringctl:
#   - TLS with a server certificate (a CA made here with openssl): a client that trusts the
#     CA gets through; a plaintext client and one without the CA do not;
#   - bearer tokens: no token and a wrong token are refused (UNAUTHENTICATED /
#     PERMISSION_DENIED), the right one passes;
#   - mutual TLS: with --tls_client_ca, a client without a certificate is refused and one
#     with a certificate signed by that CA gets through;
#   - listening beyond loopback without tokens is refused with a message naming the flags;
#   - the metrics port (--metrics_listen) under the same rules: HTTPS, the user token (401
#     without, 403 wrong), mutual TLS, loopback only without a user token;
#   - a job trains end to end under TLS and tokens: the agent's trainers reach the
#     coordinator as their agent does (its CA), each with its membership token;
#   - secrets: a token or key file others can read, a short token, the same token for users
#     and nodes, a file that is not a certificate, a key of another certificate: each refused,
#     named; the job database is created 0600.
set -uo pipefail
BIN="$TEST_SRCDIR/ringmaster"
RINGMASTER="$BIN/coordinator/ringmaster"
RINGWORKER="$BIN/worker/ringworker"
RINGTRAINER="$BIN/worker/ringtrainer"
RINGCTL="$BIN/cli/ringctl"
SPEC="$BIN/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/tls_test"
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; pkill -KILL -f "ringtrainer.*$WORK" 2>/dev/null' EXIT
umask 022  # as a person's shell: files are readable by others unless made otherwise

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
echo user-token-0123456789abcdef >user.token
echo node-token-0123456789abcdef >node.token
echo wrong-token-0123456789abcdef >wrong.token
chmod 600 user.token node.token wrong.token server.key client.key

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
grep -q "it may serve TLS: give its CA with --tls_ca" plain.out ||
  fail "a plaintext client on a TLS port is not told why: $(cat plain.out)"
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

# The metrics port (--metrics_listen) under the same rules: HTTPS with the server's
# certificate, the user token (401 without, 403 wrong), and mutual TLS when asked.
# get URL CA TOKEN [CERT KEY]: the HTTP status, or "error ..." when no answer came.
get() {
  python3 - "$@" <<'PY'
import ssl, sys, urllib.error, urllib.request
url, ca, token = sys.argv[1:4]
ctx = ssl.create_default_context(cafile=ca) if ca else None
if ctx and len(sys.argv) > 5:
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
req = urllib.request.Request(url)
if token:
    req.add_header("Authorization", "Bearer " + token)
try:
    print(urllib.request.urlopen(req, context=ctx, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("error", e)
PY
}
start metrics --metrics_listen 127.0.0.1:0
url="$(grep -o "metrics on https://127.0.0.1:[0-9]*/metrics" ringmaster-metrics.log | cut -d' ' -f3)"
[ -n "$url" ] || fail "no HTTPS metrics URL: $(cat ringmaster-metrics.log)"
[ "$(get "$url" ca.pem "$(cat user.token)")" = 200 ] || fail "metrics with the CA and token: $(get "$url" ca.pem "$(cat user.token)")"
[ "$(get "$url" ca.pem "")" = 401 ] || fail "metrics without a token: $(get "$url" ca.pem "")"
[ "$(get "$url" ca.pem "$(cat wrong.token)")" = 403 ] || fail "metrics with a wrong token"
case "$(get "${url/https/http}" "" "$(cat user.token)")" in
  error*) ;;
  *) fail "plain HTTP answered on the HTTPS metrics port" ;;
esac
start metrics-mtls --metrics_listen 127.0.0.1:0 --tls_client_ca ca.pem
url="$(grep -o "metrics on https://127.0.0.1:[0-9]*/metrics" ringmaster-metrics-mtls.log | cut -d' ' -f3)"
case "$(get "$url" ca.pem "$(cat user.token)")" in
  error*) ;;
  *) fail "the mutual-TLS metrics port served a client without a certificate" ;;
esac
[ "$(get "$url" ca.pem "$(cat user.token)" client.pem client.key)" = 200 ] ||
  fail "the mutual-TLS metrics port refused a good client"

# Beyond loopback without tokens: refused before serving.
"$RINGMASTER" --listen 0.0.0.0:0 --db "$WORK/open.db" >open.out 2>&1
[ $? -eq 2 ] || fail "listening on 0.0.0.0 without tokens was not refused"
grep -q -- "--user_token_file" open.out || fail "the refusal does not name the flags: $(cat open.out)"

# refused FLAGS... -- PATTERN WHAT: ringmaster with these flags exits 2 naming PATTERN.
refused() {
  local args=() pattern what
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  pattern="$2" what="$3"
  "$RINGMASTER" --listen 127.0.0.1:0 --db "$WORK/refused.db" "${args[@]}" >refused.out 2>&1 &
  local pid=$! rc
  for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  if kill -0 $pid 2>/dev/null; then
    kill -KILL $pid; fail "ringmaster served with $what"; return
  fi
  wait $pid; rc=$?
  [ $rc -eq 2 ] || fail "$what: exit $rc, not 2: $(cat refused.out)"
  grep -q -- "$pattern" refused.out || fail "$what: the message does not say \"$pattern\": $(cat refused.out)"
}
# Secrets.
cp user.token open.token && chmod 644 open.token
refused --user_token_file open.token --node_token_file node.token -- "chmod 600" "a token file others can read"
cp server.key open.key && chmod 644 open.key
refused --user_token_file user.token --node_token_file node.token --tls_cert server.pem \
  --tls_key open.key -- "chmod 600" "a TLS key others can read"
echo short-token >short.token && chmod 600 short.token
refused --user_token_file short.token --node_token_file node.token -- "at least 16" "a short token"
refused --user_token_file user.token --node_token_file user.token -- "same token" "one token for users and nodes"
refused --user_token_file user.token --node_token_file node.token --tls_cert ca.key \
  --tls_key server.key -- "--tls_cert does not hold a PEM certificate" "a key given as a certificate"
refused --user_token_file user.token --node_token_file node.token --tls_cert server.pem \
  --tls_key client.key -- "not the private key" "the key of another certificate"
refused --metrics_listen 0.0.0.0:0 -- "--metrics_listen 0.0.0.0:0 is not a loopback" \
  "a metrics port beyond loopback without a user token"
mode="$(stat -c %a "$WORK/db-tls.db")"
[ "$mode" = 600 ] || fail "the job database is mode $mode, not 600"

# A job end to end under TLS and tokens: an agent with the CA and the node token; its
# trainers reach the coordinator with the same CA.
if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  start job
  J="--coordinator 127.0.0.1:$PORT --token_file user.token --tls_ca ca.pem"
  "$RINGWORKER" --coordinator "127.0.0.1:$PORT" --node a --slots 2 --work_dir "$WORK/node-a" \
    --trainer "$RINGTRAINER" --node_token_file node.token --tls_ca ca.pem >agent.log 2>&1 &
  pids+=($!)
  timeout 240 "$RINGCTL" submit "$SPEC" $J --set name=tls-job --set steps=12 --set schedule.warmup_steps=2 \
    --set elastic.min_ranks=2 --set elastic.max_ranks=2 --wait >job.out 2>&1 ||
    fail "the job did not succeed under TLS: $(tail -5 job.out); trainer: $(tail -3 "$WORK"/node-a/tls-job/slot-0.log 2>/dev/null)"
  grep -q "tcp handshaker shutdown\|UNAVAILABLE" "$WORK"/node-a/tls-job/slot-*.log &&
    fail "a trainer could not reach the coordinator: $(grep -h UNAVAILABLE "$WORK"/node-a/tls-job/slot-*.log | head -2)"
  mode="$(stat -c %a "$WORK/node-a/tls-job/slot-0.token" 2>/dev/null)"
  [ "$mode" = 600 ] || fail "the membership token file is mode $mode, not 600"
else
  echo "the TLS job is skipped: Debian's dataset-fashion-mnist is not installed (tools/setup.sh)"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "PASS: tls"
