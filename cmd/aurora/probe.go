package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

// newProbeCmd is a container health check that needs no curl in the image:
// GET the URL and exit 0 on a 2xx answer within the timeout.
func newProbeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "Exit 0 if URL answers 2xx (container health checks)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
			if err != nil {
				return usageError{fmt.Errorf("probe: %w", err)}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			resp.Body.Close()
			if resp.StatusCode < 200 || resp.StatusCode > 299 {
				return fmt.Errorf("probe: %s answered %d", args[0], resp.StatusCode)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for an answer")
	return cmd
}
