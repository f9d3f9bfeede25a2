package browser

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
)

// Page is one tab on the map, with every error its console showed: calls of
// console.error, uncaught exceptions, and the browser's own error entries
// (a resource that failed to load, a Content-Security-Policy violation).
type Page struct {
	Ctx context.Context

	mu     sync.Mutex
	errors []string
}

// Open opens url in a new tab of browser and records its errors.
func Open(browser context.Context, url string) (*Page, context.CancelFunc, error) {
	ctx, cancel := chromedp.NewContext(browser)
	p := &Page{Ctx: ctx}
	messages := chromedp.Console(ctx) // subscribed before the page loads
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				p.record(m.String())
			}
		}
	}()
	if _, err := chromedp.Run(ctx, chromedp.Navigate(url)); err != nil {
		cancel()
		return nil, nil, err
	}
	return p, cancel, nil
}

func (p *Page) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errors = append(p.errors, s)
}

// Errors returns what the page raised so far.
func (p *Page) Errors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errors...)
}

// Rendered is what the page's last draw recorded: the view's generation and
// the draw's time in milliseconds.
type Rendered struct {
	Generation uint64  `json:"generation"`
	Ms         float64 `json:"ms"`
}

// WaitRendered polls until the page has drawn a view of at least generation
// gen, and returns that draw's record.
func (p *Page) WaitRendered(timeout time.Duration, gen uint64) (Rendered, error) {
	expr := fmt.Sprintf("window.gpushareRendered && window.gpushareRendered.generation >= %d", gen)
	if err := Poll(p.Ctx, timeout, expr); err != nil {
		return Rendered{}, fmt.Errorf("the page drew no view of generation %d within %v: %w", gen, timeout, err)
	}
	return Eval[Rendered](p, "window.gpushareRendered")
}

// Poll waits until expr is true on the page of ctx, for at most d.
func Poll(ctx context.Context, d time.Duration, expr string) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(20*time.Millisecond)))
	return err
}

// Eval evaluates a JavaScript expression on the page.
func Eval[T any](p *Page, expr string) (T, error) {
	return chromedp.Run(p.Ctx, chromedp.Evaluate[T](expr))
}
