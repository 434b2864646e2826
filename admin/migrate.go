package admin

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/spf13/cobra"
)

// databaseURL loads AURORA_DATABASE_URL (validated).
func databaseURL() (string, error) {
	var db config.Database
	if err := config.Load(&db); err != nil {
		return "", &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	return db.URL, nil
}

func newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply or inspect the schema migrations of AURORA_DATABASE_URL",
	}
	var asJSON bool
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply pending migrations (a no-op when up to date)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := databaseURL()
			if err != nil {
				return err
			}
			res, err := migrations.Up(cmd.Context(), url)
			if err != nil {
				return err
			}
			if asJSON {
				if res == nil {
					res = []migrations.Result{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"applied": res})
			}
			if len(res) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "up to date: no migrations applied")
				return nil
			}
			for _, r := range res {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %05d %s (%s)\n", r.Version, r.Source, r.Duration)
			}
			return nil
		},
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := databaseURL()
			if err != nil {
				return err
			}
			st, err := migrations.StatusOf(cmd.Context(), url)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"migrations": st})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "VERSION\tSTATE\tAPPLIED AT\tSOURCE")
			for _, s := range st {
				state := "pending"
				if s.Applied {
					state = "applied"
				}
				fmt.Fprintf(w, "%05d\t%s\t%s\t%s\n", s.Version, state, s.AppliedAt, s.Source)
			}
			return w.Flush()
		},
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(up, status)
	return cmd
}
