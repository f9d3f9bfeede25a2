package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpushare/gpushare/inspector/cmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cmd.Execute(ctx, os.Args[1:], cmd.Streams{Out: os.Stdout, ErrOut: os.Stderr}, cmd.NewKubeFlags(), cmd.NewForConfig)
	stop()
	os.Exit(code)
}
