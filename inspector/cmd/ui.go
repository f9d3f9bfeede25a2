package cmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpushare/gpushare/inspector/ui"
)

const uiLong = `Serve a live map of the cluster's GPUs on this machine and open it in the
browser: every node, every GPU a bar of its memory, every pod a block of its
units coloured by namespace, memory really used where the device plugin
measures it, tiers, health, MIG-skipped GPUs and each node's mode; the pending
pods with why's reason; and a form that runs fit on a pasted manifest. It
watches the cluster, so a pod created or deleted shows within a second or two.

It listens on 127.0.0.1 only, with your kubeconfig and your rights (list and
watch on nodes and on pods in all namespaces; resourceslices and
resourceclaims for DRA-mode nodes), and installs nothing in the cluster.
Ctrl-C stops it.`

// uiOptions are the ui command's flags.
type uiOptions struct {
	explainOptions
	address   string
	noBrowser bool
}

func newUICommand(streams Streams, kube ConfigGetter, newClient NewClientFunc) *cobra.Command {
	o := &uiOptions{explainOptions: explainOptions{Streams: streams, config: kube, newClient: newClient}}
	c := &cobra.Command{
		Use:   "ui",
		Short: "Serve a live map of the cluster's GPUs on 127.0.0.1 and open it in the browser",
		Long:  uiLong,
		Example: `  kubectl inspect gpushare ui
  kubectl inspect gpushare ui --address 127.0.0.1:8080 --no-browser`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.complete(); err != nil {
				return err
			}
			return o.run(c.Context())
		},
	}
	c.Flags().StringVar(&o.policy, "policy", "bestfit", "the extender's -policy, for why and fit: bestfit, spread or firstfit")
	c.Flags().StringVar(&o.address, "address", "127.0.0.1:0", "where to listen: a loopback address and a port (0: any free one)")
	c.Flags().BoolVar(&o.noBrowser, "no-browser", false, "print the address without opening a browser")
	return c
}

// run serves the map until ctx ends.
func (o *uiOptions) run(ctx context.Context) error {
	if err := loopback(o.address); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.address)
	if err != nil {
		return fmt.Errorf("--address: %w", err)
	}
	defer ln.Close()
	fmt.Fprintln(o.ErrOut, "reading the cluster…")
	w, err := ui.StartWatch(ctx, o.client)
	if err != nil {
		return apiError("watch the cluster", err)
	}
	if w.DRAError != nil {
		fmt.Fprintln(o.ErrOut, "warning: DRA-mode nodes not shown: "+w.DRAError.Error())
	}
	srv := ui.NewServer(w, o.Policy, o.namespace)
	go srv.Run(ctx)
	hs := &http.Server{Handler: srv.Handler(ln.Addr().String()), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(shutdown)
		hs.Close() // the event streams do not end by themselves
	}()
	url := "http://" + ln.Addr().String() + "/"
	fmt.Fprintln(o.Out, "serving the GPU map at "+url+" (Ctrl-C stops)")
	if !o.noBrowser {
		if err := openBrowser(url); err != nil {
			fmt.Fprintln(o.ErrOut, "could not open a browser ("+err.Error()+"): open "+url+" yourself")
		}
	}
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loopback refuses an address that is not on this machine's loopback: the
// page answers with the user's rights, so nobody else may reach it.
func loopback(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("--address %q: %w", address, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--address %q: the map serves your cluster with your rights, so it listens on a loopback address only (127.0.0.1, ::1)", address)
	}
	return nil
}

// openBrowser asks the desktop to open url, without waiting for it.
func openBrowser(url string) error {
	var c *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		c = exec.Command("open", url)
	case "windows":
		c = exec.Command("rundll32", "url.dll,FileProtocolHandler", url)
	default:
		c = exec.Command("xdg-open", url)
	}
	if err := c.Start(); err != nil {
		return err
	}
	go c.Wait() //nolint:errcheck // the opener's exit says nothing about the page
	return nil
}
