// Package collect turns the Node and Pod lists of one API read into the
// inspector's model (Report): per node, per GPU and per pod what is allocated,
// recomputed from the pod annotations alone, as the old gpushare CLI did and as
// the scheduler extender rebuilds its view after a restart. On DRA-mode nodes
// (dra.go) it reads the GPUs from our driver's ResourceSlices and the charges
// from the allocated ResourceClaims instead.
//
// It is pure: no I/O, no clock, no globals. Objects it cannot read (a
// malformed annotation, an invalid request) never stop it: they are left out
// and listed in Report.Skipped with the reason, so the CLI shows everything
// else and says on stderr what it left out.
package collect
