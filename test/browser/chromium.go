package browser

import (
	"context"
	"errors"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// Chromium finds the browser: $CHROMIUM, else chromium or chromium-browser
// on PATH (Debian's package installs /usr/bin/chromium; .ci/run installs it).
func Chromium() (string, error) {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no Chromium: install Debian's chromium package (apt-get install chromium) or set CHROMIUM")
}

// Start launches a headless Chromium of its own (a new profile in dir) and
// returns a browser context and its cancel. The flags keep it from reaching
// out to Google's services, which this machine's network refuses.
func Start(ctx context.Context, dir string) (context.Context, context.CancelFunc, error) {
	exe, err := Chromium()
	if err != nil {
		return nil, nil, err
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(dir),
		chromedp.Headless,
		chromedp.NoSandbox, // root in CI containers
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1600, 1000),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	if _, err := chromedp.Run(browser, chromedp.Navigate("about:blank")); err != nil {
		cancelBrowser()
		cancelAlloc()
		return nil, nil, err
	}
	return browser, func() { cancelBrowser(); cancelAlloc() }, nil
}
