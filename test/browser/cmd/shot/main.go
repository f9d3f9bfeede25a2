// Command shot saves a picture of a live map page (kubectl inspect gpushare
// ui) once it has drawn, for docs/img:
//
//	go run ./cmd/shot -url http://127.0.0.1:8080/ -out ../../docs/img/map.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpushare/gpushare/test/browser"
)

func main() {
	url := flag.String("url", "", "the page")
	out := flag.String("out", "map.png", "PNG file to write")
	flag.Parse()
	if err := run(*url, *out); err != nil {
		fmt.Fprintln(os.Stderr, "shot:", err)
		os.Exit(1)
	}
}

func run(url, out string) error {
	if url == "" {
		return fmt.Errorf("-url is required")
	}
	dir, err := os.MkdirTemp("", "shot")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, stop, err := browser.Start(ctx, dir)
	if err != nil {
		return err
	}
	defer stop()
	page, closePage, err := browser.Open(b, url)
	if err != nil {
		return err
	}
	defer closePage()
	if _, err := page.WaitRendered(time.Minute, 1); err != nil {
		return err
	}
	png, err := chromedp.Run(page.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		return err
	}
	if errs := page.Errors(); len(errs) > 0 {
		return fmt.Errorf("the page raised errors: %v", errs)
	}
	return os.WriteFile(out, png, 0o644)
}
