// Command aurora-inbox runs the Stripe webhook inbox and its worker (seed
// 003); the same as `aurora inbox`. Exit 0 on a clean stop or a valid
// --validate, 2 on invalid configuration or usage, 1 otherwise.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aurora-billing/aurora/inbox/inboxcmd"
	"github.com/aurora-billing/aurora/shared/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := inboxcmd.New("aurora-inbox")
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "aurora-inbox: "+err.Error())
	if errors.Is(err, config.ErrInvalid) {
		os.Exit(2)
	}
	os.Exit(1)
}
