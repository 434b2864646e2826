package main

import (
	"github.com/aurora-billing/aurora/reconciler/reconcilercmd"
	"github.com/spf13/cobra"
)

// newReconcilerCmd is `aurora reconciler`: provider reconciliation on a
// schedule (seed 000, "Reconciliation"), the same command as the
// aurora-reconciler binary.
func newReconcilerCmd() *cobra.Command { return reconcilercmd.New("reconciler") }
