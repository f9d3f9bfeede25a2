// Package browser drives kubectl inspect gpushare ui in a real browser:
// Debian's Chromium, headless, through the DevTools protocol (chromedp).
// It is a module of its own so the project's go.mod never requires
// chromedp; the project's packages come from the repository through the
// replace in go.mod. The test against the test bed is behind the e2e tag;
// the render benchmark needs only Chromium.
package browser
