// Package dashboard holds the test that keeps manifests/grafana/gpushare.json
// honest: every PromQL query in it must parse with Prometheus's own parser and
// select only series that the extender and the device plugin really export,
// as their metric registries, built in-process, report them. A renamed metric
// fails the test instead of leaving an empty panel nobody notices.
package dashboard
