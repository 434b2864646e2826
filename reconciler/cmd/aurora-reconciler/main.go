// Command aurora-reconciler runs the reconciler; the same as `aurora
// reconciler`. Exit 0 on a clean stop, a valid --validate or a successful
// --once, 2 on invalid configuration or usage, 1 otherwise.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aurora-billing/aurora/reconciler/reconcilercmd"
	"github.com/aurora-billing/aurora/shared/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := reconcilercmd.New("aurora-reconciler")
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "aurora-reconciler: "+err.Error())
	if errors.Is(err, config.ErrInvalid) {
		os.Exit(2)
	}
	os.Exit(1)
}
