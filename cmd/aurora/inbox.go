package main

import (
	"github.com/aurora-billing/aurora/inbox/inboxcmd"
	"github.com/spf13/cobra"
)

// newInboxCmd is `aurora inbox`: the Stripe webhook endpoint and its worker
// (seed 003), the same command as the aurora-inbox binary.
func newInboxCmd() *cobra.Command { return inboxcmd.New("inbox") }
