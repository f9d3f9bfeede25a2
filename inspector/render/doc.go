// Package render writes an inspector Report to an io.Writer: the summary and
// details tables byte for byte as the old kubectl-inspect-gpushare printed
// them (docs/contract.md section 5, text/tabwriter with padding 2, the same
// dash-line lengths and trailing spaces), with our additions confined to
// nodes run by our device plugin or our DRA driver, and the JSON and YAML
// forms of the report.
//
// It does no I/O beyond the writer it is given and holds no state.
package render
