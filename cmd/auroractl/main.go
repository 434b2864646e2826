// Command auroractl is aurora's operator CLI; see package admin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/aurora-billing/aurora/admin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := admin.Main(ctx, os.Args[1:], admin.IO{Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
