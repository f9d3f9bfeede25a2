#!/usr/bin/env bash
# Issues what mutual TLS between kube-scheduler and the extender needs, from a CA made for this
# alone (never the cluster CA: a certificate the cluster CA signed for anything else would pass).
#
#   manifests/mtls/gen-certs.sh OUT_DIR [--ip ADDRESS]... [--dns NAME]... [--client NAME]... [--days N]
#
# OUT_DIR gets:
#   ca.crt, ca.key                 the CA (keep ca.key offline; it signs every renewal)
#   extender.crt, extender.key     the extender's serving certificate: the Service's DNS names,
#                                  127.0.0.1, and each --dns and --ip (add the Service's cluster IP
#                                  when the scheduler calls it by address)
#   kube-scheduler.crt/.key        the client certificate kube-scheduler presents (CN
#                                  gpushare-kube-scheduler, the name mtls/ lets call the verbs)
#   NAME.crt, NAME.key             one more client certificate per --client (e.g. prometheus: it may
#                                  read /metrics and /inspect, not call the verbs)
#   secret.yaml                    the Secret kube-system/gpushare-scheduler-extender-tls the
#                                  extender mounts: tls.crt, tls.key and ca.crt (client CA)
# Run it again with the same OUT_DIR to renew: the CA is reused when ca.key is there.
set -euo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
ips=(127.0.0.1) dns=() clients=() days=365
while [ $# -gt 0 ]; do
  case $1 in
    --ip) ips+=("$2"); shift 2 ;;
    --dns) dns+=("$2"); shift 2 ;;
    --client) clients+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) usage ;;
  esac
done
command -v openssl >/dev/null || { echo "gen-certs.sh: openssl is required" >&2; exit 1; }
mkdir -p "$out"
umask 077

svc=gpushare-scheduler-extender
ns=kube-system
names=("$svc" "$svc.$ns" "$svc.$ns.svc" "$svc.$ns.svc.cluster.local" "${dns[@]}")

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f "$out/ca.key" ]; then
  key "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -subj "/CN=gpushare-scheduler-extender-ca" -days $((days * 5)) \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$out/ca.crt"
fi

# issue NAME SUBJECT EXTENSIONS: a key and a certificate the CA signs.
issue() {
  local name=$1 subject=$2 ext=$3
  key "$out/$name.key"
  openssl req -new -key "$out/$name.key" -subj "$subject" -out "$out/$name.csr"
  printf '%s\n' "$ext" >"$out/$name.ext"
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -extfile "$out/$name.ext" -out "$out/$name.crt" 2>/dev/null
  rm -f "$out/$name.csr" "$out/$name.ext"
}

san=""
for n in "${names[@]}"; do san+="DNS:$n,"; done
for i in "${ips[@]}"; do san+="IP:$i,"; done
issue extender "/CN=$svc.$ns.svc" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=${san%,}"

client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
issue kube-scheduler "/CN=gpushare-kube-scheduler" "$client_ext"
for c in "${clients[@]}"; do issue "$c" "/CN=$c" "$client_ext"; done

b64() { base64 <"$1" | tr -d '\n'; }
cat >"$out/secret.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $svc-tls
  namespace: $ns
  labels:
    app.kubernetes.io/name: $svc
    app.kubernetes.io/part-of: gpushare
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$out/extender.crt")
  tls.key: $(b64 "$out/extender.key")
  ca.crt: $(b64 "$out/ca.crt")
YAML
echo "wrote $out: apply secret.yaml; copy ca.crt, kube-scheduler.crt and kube-scheduler.key to /etc/kubernetes/gpushare/ on each control-plane node"
