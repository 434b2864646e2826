package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/demo/feed"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// importBatch is how many events one transaction of `usage import` records
// (the demo's batch size).
const importBatch = 500

// RefusedEvent is a well-formed input event the usage API refused (an id
// reused with other content, a correction of an unknown event, …): counted
// and reported with its line, never recorded, never aborting the import.
type RefusedEvent struct {
	Line    int    `json:"line"`
	EventID string `json:"event_id"`
	Reason  string `json:"reason"`
}

// ImportSummary is the --json output of `usage import` (stable; add
// fields, never rename). The malformed-line report is the demo's:
// malformed_lines counts every rejected line, first_malformed keeps the
// first feed.MaxReported with their line numbers and reasons.
type ImportSummary struct {
	Input          string           `json:"input"`
	Format         feed.Format      `json:"format"`
	Lines          int              `json:"lines"` // non-blank lines read
	UsageEvents    int              `json:"usage_events"`
	Tenants        int              `json:"tenants"`
	MalformedLines int              `json:"malformed_lines"`
	FirstMalformed []feed.Malformed `json:"first_malformed"`
	RefusedEvents  int              `json:"refused_events"`
	FirstRefused   []RefusedEvent   `json:"first_refused"`
	Recorded       int              `json:"recorded"`         // newly recorded events
	AlreadyPresent int              `json:"already_recorded"` // events recorded before with the same content
}

func newUsageImportCmd() *cobra.Command {
	var format, source string
	var rebase, asJSON bool
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Record every event of a JSONL or access-log file (the demo's formats), in transactions of 500",
		Long: `Record a file of usage with the services' rules, 500 events per transaction.

Formats (see package demo/feed): JSONL, one object a line
  {"tenant":"org_123","event_id":"req-1","feature":"api_calls","quantity":1,"timestamp":"2026-09-01T10:00:00Z"}
(with an optional "corrects":"<event_id>"), or an Apache/nginx access log (common or combined):
one api_calls unit per request and its response bytes as egress_bytes, the client host
anonymised as the tenant, event ids "<source>:<line>:<feature>" (source: the file name
without its extension, or --source). The format is detected unless --format says it.

Importing the same file again records nothing new: events are idempotent by tenant and
event id. A malformed line or refused event is reported with its line number (the first
20) and skipped; the exit status is then 2, after every other event was recorded.
Progress goes to stderr when it is a terminal.`,
		Example: `  auroractl usage import usage.jsonl
  auroractl usage import access.log --rebase-time --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			settings, err := exportSettings()
			if err != nil {
				return err
			}
			path := args[0]
			f, err := os.Open(path)
			if err != nil {
				return &ExitError{Code: ExitNotFound, Msg: fmt.Sprintf("cannot open %s: %v", path, err), Err: err}
			}
			defer f.Close()
			fmtUsed := feed.Format(format)
			if format == "" || format == "auto" {
				head := make([]byte, 4096)
				n, _ := io.ReadFull(f, head)
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
				fmtUsed = feed.DetectFile(path, head[:n])
			} else if fmtUsed != feed.FormatJSONL && fmtUsed != feed.FormatAccessLog {
				return invalidInput("--format must be auto, jsonl or access-log")
			}
			if source == "" {
				source = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
			}
			res, err := feed.Read(f, fmtUsed, source)
			if err != nil {
				return err
			}
			if rebase {
				res.Rebase(time.Now().UTC())
			}
			sum := &ImportSummary{Input: filepath.Base(path), Format: fmtUsed, Lines: res.Lines, UsageEvents: len(res.Events), Tenants: res.Tenants,
				MalformedLines: res.MalformedLines, FirstMalformed: append([]feed.Malformed{}, res.FirstMalformed...), FirstRefused: []RefusedEvent{}}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			var progress io.Writer
			if isTerminal(cmd.ErrOrStderr()) {
				progress = cmd.ErrOrStderr()
			}
			if err := importEvents(cmd.Context(), pool, settings.Gate(), res, sum, progress); err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(sum); err != nil {
					return err
				}
			} else {
				printImportSummary(cmd.OutOrStdout(), sum)
			}
			switch {
			case sum.UsageEvents == 0:
				return invalidInput("%s has no usable usage lines (%d non-blank lines, %d malformed)", sum.Input, sum.Lines, sum.MalformedLines)
			case sum.MalformedLines > 0 || sum.RefusedEvents > 0:
				return invalidInput("%d malformed lines and %d refused events were skipped; every other event is recorded (fix them and import again: recording is idempotent)", sum.MalformedLines, sum.RefusedEvents)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&format, "format", "auto", "auto|jsonl|access-log")
	f.StringVar(&source, "source", "", "access logs: the name in event ids (default the file name without its extension)")
	f.BoolVar(&rebase, "rebase-time", false, "shift every timestamp so the newest is now (trials only: a later import of the same file with another shift is refused event_conflict)")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// importEvents records res.Events in transactions of importBatch with
// gate.RecordBatch. A batch the usage API refuses (isUsageDataError) is
// recorded again one event per transaction, so only the refused events
// are left out (counted in sum, the first feed.MaxReported kept). A
// database error ends the import; the batches before it stay committed.
// progress, when not nil, gets a "\r…" line per batch.
func importEvents(ctx context.Context, pool *pgxpool.Pool, gate usage.Gate, res *feed.Result, sum *ImportSummary, progress io.Writer) error {
	total := len(res.Events)
	for i := 0; i < total; i += importBatch {
		end := min(i+importBatch, total)
		var created int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			created, err = gate.RecordBatch(ctx, tx, res.Events[i:end])
			return err
		})
		if err != nil && isUsageDataError(err) {
			created, err = 0, nil
			for j := i; j < end && err == nil; j++ {
				var ok bool
				e := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					_, ok, err = gate.Record(ctx, tx, res.Events[j])
					return err
				})
				switch {
				case e == nil && ok:
					created++
				case e == nil:
				case isUsageDataError(e):
					sum.RefusedEvents++
					if len(sum.FirstRefused) < feed.MaxReported {
						sum.FirstRefused = append(sum.FirstRefused, RefusedEvent{Line: res.LineOf(j), EventID: res.Events[j].EventID, Reason: e.Error()})
					}
				default:
					err = e
				}
			}
		}
		if err != nil {
			return fmt.Errorf("usage import: events %d–%d: %w (the events before were recorded; import again to resume)", i+1, end, err)
		}
		sum.Recorded += created
		if progress != nil {
			fmt.Fprintf(progress, "\r%d/%d events recorded   ", end, total)
		}
	}
	sum.AlreadyPresent = total - sum.Recorded - sum.RefusedEvents
	if progress != nil && total > 0 {
		fmt.Fprintln(progress)
	}
	return nil
}

// printImportSummary prints sum as the demo prints its input report.
func printImportSummary(w io.Writer, s *ImportSummary) {
	fmt.Fprintf(w, "auroractl usage import — input %s (%s)\n", s.Input, s.Format)
	fmt.Fprintf(w, "  usage events      %d from %d tenants (%d malformed lines, %d events refused)\n", s.UsageEvents, s.Tenants, s.MalformedLines, s.RefusedEvents)
	for _, m := range s.FirstMalformed {
		fmt.Fprintf(w, "    line %d: %s\n", m.Line, m.Reason)
	}
	for _, r := range s.FirstRefused {
		fmt.Fprintf(w, "    line %d, event %s: %s\n", r.Line, r.EventID, r.Reason)
	}
	fmt.Fprintf(w, "  recorded          %d new, %d already recorded\n", s.Recorded, s.AlreadyPresent)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
