package gpushare

// LabelAllowEnvFrom on a namespace, "true", lets pods there that require an
// enforcing isolation tier take envFrom on their gpu-mem containers: the
// shipped admission policy (manifests/base/tenant-admission.yaml) refuses it
// otherwise, since a ConfigMap or Secret could set the variables that
// enforce the limit. A namespace's owner sets it, vouching for what its
// ConfigMaps and Secrets hold.
const LabelAllowEnvFrom = "gpushare.io/allow-env-from"
