#!/usr/bin/env bash
# Issues gpushare-webhook's serving certificate from a CA made for it alone, and writes what the
# API server and the webhook need:
#
#   manifests/dra/gen-webhook-cert.sh OUT_DIR [--days N] [--namespace NS]
#
# OUT_DIR gets:
#   ca.crt, ca.key           the CA (keep ca.key offline; it signs every renewal)
#   webhook.crt/.key         the serving certificate for gpushare-webhook.NS.svc (NS: kube-system)
#   secret.yaml              the Secret NS/gpushare-webhook-tls the Deployment mounts
#   cabundle-patch.yaml      a kustomize patch setting the MutatingWebhookConfiguration's caBundle
#   cabundle.b64             the same CA, base64, for Helm's dra.webhook.caBundle
# Then: kubectl apply -f OUT_DIR/secret.yaml, and apply manifests/dra with the patch (or run
# kubectl patch mutatingwebhookconfiguration gpushare-webhook --type=json -p "$(cat OUT_DIR/cabundle.json)").
# Run it again with the same OUT_DIR to renew: the CA is reused when ca.key is there.
set -euo pipefail
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
days=365 ns=kube-system
while [ $# -gt 0 ]; do
  case $1 in
    --days) days=$2; shift 2 ;;
    --namespace) ns=$2; shift 2 ;;
    *) usage ;;
  esac
done
command -v openssl >/dev/null || { echo "gen-webhook-cert.sh: openssl is required" >&2; exit 1; }
mkdir -p "$out"
umask 077
svc=gpushare-webhook
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
if [ ! -f "$out/ca.key" ]; then
  key "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -subj "/CN=$svc-ca" -days $((days * 5)) \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$out/ca.crt"
fi
key "$out/webhook.key"
openssl req -new -key "$out/webhook.key" -subj "/CN=$svc.$ns.svc" -out "$out/webhook.csr"
printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n' \
  "$svc" "$svc" "$ns" "$svc" "$ns" "$svc" "$ns" >"$out/webhook.ext"
openssl x509 -req -in "$out/webhook.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days "$days" -extfile "$out/webhook.ext" -out "$out/webhook.crt" 2>/dev/null
rm -f "$out/webhook.csr" "$out/webhook.ext"
b64() { base64 <"$1" | tr -d '\n'; }
cat >"$out/secret.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $svc-tls
  namespace: $ns
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$out/webhook.crt")
  tls.key: $(b64 "$out/webhook.key")
YAML
cat >"$out/cabundle-patch.yaml" <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: $svc
webhooks:
- name: pods.gpu-mem.gpushare.io
  clientConfig:
    caBundle: $(b64 "$out/ca.crt")
YAML
printf '[{"op":"add","path":"/webhooks/0/clientConfig/caBundle","value":"%s"}]\n' "$(b64 "$out/ca.crt")" >"$out/cabundle.json"
b64 "$out/ca.crt" >"$out/cabundle.b64"
echo "wrote $out: apply secret.yaml, then manifests/dra with cabundle-patch.yaml (or patch with cabundle.json; with Helm: --set dra.webhook.caBundle=\$(cat $out/cabundle.b64))"
