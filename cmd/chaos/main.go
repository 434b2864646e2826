// Command chaos runs aurora's chaos harness (package chaos): Postgres (its
// own initdb cluster), nats-server, the Stripe emulator, the relay and
// three deliverers, each a separate OS process built from this checkout;
// a producer stages usage while a seeded schedule kills, stops and
// restarts the services; a checker then states the invariants.
//
//	go run ./cmd/chaos                        # the kill trial: 10,000 items
//	go run ./cmd/chaos --mode short           # the CI mode: 3,000 items, ≥ 50 faults, < 5 min
//	go run ./cmd/chaos --mode short --seed 7  # reproduce a run
//	go run ./cmd/chaos --mode long --seed 1   # the release run: 100,000 items, ≥ 1,000 faults, ~35 min
//
// Exit status 0 when every invariant held, 1 when one broke (the seed and
// the command that reproduces the run are printed), 2 for bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/aurora-billing/aurora/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	mode := fs.String("mode", "kill-trial", "kill-trial (10,000 items, hot-lane owners killed), short (CI: 3,000 items, ≥ 50 faults) or long (release: 100,000 items, ≥ 1,000 faults, 3 NATS nodes, ~35 min)")
	src := fs.String("src", "", "aurora source tree to build the binaries from (default: this checkout)")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()%1000000), "seed of the producer and the fault schedule (default: from the clock, printed)")
	items := fs.Int("items", 0, "items to stage (0 = the mode's)")
	stageFor := fs.Duration("stage-for", 0, "how long the producer stages while faults run (0 = the mode's)")
	dir := fs.String("dir", "", "work directory for logs and data (default: a temporary one, removed after a green run)")
	keep := fs.Bool("keep", false, "keep the work directory after a green run")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	batchItems := fs.Int("relay-batch-message-items", 0, "the relays' AURORA_RELAY_BATCH_MESSAGE_ITEMS, 1..1000 (0 = the relay's default: one message per item)")
	natsNodes := fs.Int("nats-nodes", 0, "nats-server nodes: 1, or 3 (a cluster, streams at 3 replicas, the stream leader and followers killed too); 0 = the mode's")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var o chaos.Options
	switch *mode {
	case "kill-trial":
		o = chaos.KillTrial(*seed)
	case "short":
		o = chaos.Short(*seed)
	case "long":
		o = chaos.Long(*seed)
	default:
		fmt.Fprintf(os.Stderr, "chaos: --mode must be kill-trial, short or long, got %q\n", *mode)
		return 2
	}
	cmd := []string{"go run ./cmd/chaos", "--mode", *mode, "--seed", fmt.Sprint(*seed)}
	if *items > 0 {
		o.Items = *items
		cmd = append(cmd, "--items", fmt.Sprint(*items))
	}
	if *stageFor > 0 {
		o.StageFor = *stageFor
		cmd = append(cmd, "--stage-for", stageFor.String())
	}
	switch *natsNodes {
	case 0:
	case 1, 3:
		if *natsNodes != o.NATSNodes {
			cmd = append(cmd, "--nats-nodes", fmt.Sprint(*natsNodes))
		}
		o.NATSNodes = *natsNodes
	default:
		fmt.Fprintf(os.Stderr, "chaos: --nats-nodes must be 1 or 3, got %d\n", *natsNodes)
		return 2
	}
	switch n := *batchItems; {
	case n == 0:
	case n >= 1 && n <= 1000:
		o.RelayBatchMessageItems = n
		cmd = append(cmd, "--relay-batch-message-items", fmt.Sprint(n))
	default:
		fmt.Fprintf(os.Stderr, "chaos: --relay-batch-message-items must be 1..1000, got %d\n", n)
		return 2
	}
	if *src != "" {
		o.Src = *src
		cmd = append(cmd, "--src", *src)
	}
	o.Dir, o.Keep, o.Command, o.Progress = *dir, *keep, strings.Join(cmd, " "), os.Stderr
	rep, err := chaos.Run(ctx, o)
	if rep != nil {
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			printReport(rep)
		}
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, chaos.ErrInvariant):
		fmt.Fprintf(os.Stderr, "chaos: FAILED, seed %d; reproduce with:\n  %s\n", rep.Seed, rep.Command)
		if rep.Dir != "" {
			fmt.Fprintf(os.Stderr, "chaos: logs in %s\n", rep.Dir)
		}
		return 1
	default:
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
}

func printReport(r *chaos.Report) {
	w := os.Stdout
	total := 0
	var kinds []string
	for k, n := range r.Faults {
		total += n
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "aurora chaos — seed %d (%s)\n", r.Seed, r.Command)
	fmt.Fprintf(w, "  items            %d staged (%d corrections), %d rows, by state %v\n", r.Items, r.Corrections, r.Staged, r.ByState)
	fmt.Fprintf(w, "  faults           %d injected (%s), %d skipped (no target up), %d of them after the staging ended\n", total, strings.Join(kinds, " "), r.FaultsSkipped, r.FaultsAfterStaging)
	fmt.Fprintf(w, "  lost             %d\n", r.Lost)
	fmt.Fprintf(w, "  applied twice    %d\n", r.AppliedTwice)
	fmt.Fprintf(w, "  mismatched       %d\n", r.Mismatched)
	fmt.Fprintf(w, "  quantity         committed %d, applied %.0f\n", r.Committed, r.Applied)
	fmt.Fprintf(w, "  429 overlaps     %d (one call per customer and meter), other 429 %d\n", r.Overlaps429, r.RateLimited429)
	fmt.Fprintf(w, "  reclaimed        %d items claimed more than once; attempts by outcome %v\n", r.Reclaimed, r.Attempts)
	fmt.Fprintf(w, "  stale leases     %d (held by a killed or stopped owner), waited p50 %.1fs, max %.1fs for the take-over\n", r.StaleLeases, r.StaleLeaseWaitP50, r.StaleLeaseWaitMax)
	fmt.Fprintf(w, "  owner kills      %d hitting hot lanes; lane wait to next acceptance p50 %.1fs, max %.1fs\n", len(r.OwnerKills), r.LaneWaitP50, r.LaneWaitMax)
	if len(r.NewLeader) > 0 {
		fmt.Fprintf(w, "  stream leader    %d kills; a new AURORA_OUTBOX leader after (s) %v\n", len(r.NewLeader), r.NewLeader)
	}
	fmt.Fprintf(w, "  lease fence      %d stale outcomes, %d accepted items without one accepted attempt at their lease\n", r.StaleOutcomes, r.AcceptanceMismatch)
	fmt.Fprintf(w, "  stream           %d messages stored for %d dispatches (%d marked published)\n", r.MessagesStored, r.Dispatches, r.DispatchesPublished)
	var rk []string
	for k := range r.Recovery {
		rk = append(rk, string(k))
	}
	sort.Strings(rk)
	for _, k := range rk {
		rc := r.Recovery[chaos.FaultKind(k)]
		fmt.Fprintf(w, "  recovery         %-20s n=%d, to the next new item accepted p50 %.1fs, max %.1fs; to the next acceptance p50 %.1fs, max %.1fs\n", k, rc.N, rc.P50, rc.Max, rc.StallP50, rc.StallMax)
	}
	fmt.Fprintf(w, "  staged→accepted  p50 %.2fs, p99 %.2fs, max %.2fs\n", r.AcceptP50, r.AcceptP99, r.AcceptMax)
	fmt.Fprintf(w, "  exited by itself %v (restarted by the harness)\n", r.Exits)
	fmt.Fprintf(w, "  drained          %t, %.1fs after the load; run %.0fs\n", r.Drained, r.DrainSeconds, r.ElapsedSeconds)
	if e := r.Events; e != nil {
		fmt.Fprintf(w, "  domain events    %d published, %d processed once, %d posted once, %d duplicate deliveries skipped, %d retried, %d dead letters, missing %d, extra %d; outbox %v; all within %.1fs after the drain\n",
			e.Published, e.Processed, e.Posted, e.DuplicatesSkipped, e.HandlerRetries, e.DeadLetters, e.Missing, e.Extra, e.OutboxByStatus, e.WaitSeconds)
		fmt.Fprintf(w, "  reconciler       %d runs (%d ok), %d items confirmed before the final run, %d after; items opened by kind %v; final run: %d windows compared, %d unsettled, findings %v\n",
			e.ReconcilerRuns, e.ReconcilerRunsOK, e.ConfirmedBeforeFinal, e.Confirmed, e.FindingsOpened, e.FinalWindowsCompared, e.FinalWindowsUnsettled, e.FinalFindings)
	}
	if wh := r.Webhooks; wh != nil {
		fmt.Fprintf(w, "  webhooks         %d customers, %d events, %d requests, %d answered 2xx, %d failed and retried, %d redeliveries (%d to both inboxes at once), %d same-second pairs, %d scripts abandoned\n",
			wh.Customers, wh.Events, wh.Requests, wh.Answered2xx, wh.Failed, wh.Redeliveries, wh.Concurrent, wh.SameSecond, wh.Abandoned)
		fmt.Fprintf(w, "  inbox            2xx without row %d, not stored %d, never 2xx %d, refused %v; drained %t in %.1fs; %d ambiguities expected; %d projection mismatches\n",
			wh.NoRowAfter2xx, wh.NotStored, wh.Never2xx, wh.Refused, wh.Drained, wh.DrainSeconds, wh.Ambiguities, wh.ProjectionMismatches)
	}
	if len(r.Failures) == 0 {
		fmt.Fprintln(w, "  invariants       every one held")
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  FAILED           %s\n", f)
	}
}
