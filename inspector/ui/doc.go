// Package ui serves kubectl inspect gpushare ui: a live map of the
// cluster's GPUs in the browser, on 127.0.0.1 only, with the user's own
// kubeconfig and rights (docs/inspector.md, "The live map").
//
// A Source (informers, or a fixed snapshot in tests) says what the cluster
// holds and when it changed; Server rebuilds the View (the inspector's
// report, the pending pods with why's summary, the GPUs a node skips) at
// most every MinRebuild, and pushes it to every open page as a
// Server-Sent Event. The page (assets/, embedded: nothing is fetched at run
// time) draws every node, every GPU a bar of its memory and every pod a
// block sized by its units, and runs fit on a pasted manifest.
package ui
