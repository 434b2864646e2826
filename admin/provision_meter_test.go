package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/internal/pipelinetest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
)

// provision meter: a plan without --yes (nothing written, no meter
// created), the staged items a remap affects, the remap with --yes, and
// moving the feature back by adopting the meter that holds the old event
// name; an unusable meter is refused.
func TestProvisionMeterPlansThenApplies(t *testing.T) {
	p := pipelinetest.New(t)
	ctx := context.Background()
	env := map[string]string{"AURORA_DATABASE_URL": p.DatabaseURL, "AURORA_STRIPE_API_KEY": pipelinetest.Key, "AURORA_STRIPE_API_BASE": p.APIBase}
	acct := pipelinetest.Account
	mapping := func() (meter, event string, version int32) {
		t.Helper()
		if err := p.Pool.QueryRow(ctx, `SELECT meter_id, event_name, mapping_version FROM meter_mappings WHERE feature = 'api_calls'`).Scan(&meter, &event, &version); err != nil {
			t.Fatal(err)
		}
		return
	}
	step := func(name string, wantCode int, wantOut string, args ...string) string {
		t.Helper()
		code, out, errOut := runCtl(t, env, append([]string{"provision", "meter", "--account", acct, "--feature", "api_calls"}, args...)...)
		if code != wantCode || !strings.Contains(out+errOut, wantOut) {
			t.Fatalf("%s: code %d\n%s%s\nwant %d containing %q", name, code, out, errOut, wantCode, wantOut)
		}
		return out
	}

	step("first plan", ExitOK, "DRY RUN", "--event-name", "ev_calls")
	if n := len(p.Emulator.Meters()); n != 0 {
		t.Fatalf("a dry run created %d meters", n)
	}
	step("first map", ExitOK, "mapping_version 1, create", "--event-name", "ev_calls", "--yes")
	m1, _, _ := mapping()
	step("same again", ExitOK, "nothing to do", "--event-name", "ev_calls", "--yes")

	// Two items staged for version 1.
	gate := usage.Gate{Recorder: usage.Recorder{DestinationAccount: acct, Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources: usage.Sources{"api_calls": usage.SourceEvents}}
	for _, id := range []string{"a", "b"} {
		if err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
			_, _, err := gate.Record(ctx, tx, usage.Event{Tenant: "org_m", EventID: id, Feature: "api_calls", Quantity: 1, OccurredAt: time.Now()})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	out := step("remap plan", ExitOK, "2 pending or leased items built for version 1", "--event-name", "ev_calls_v2")
	if !strings.Contains(out, "mapping_version 2") || !strings.Contains(out, "auroractl recovery restage --feature api_calls") {
		t.Fatalf("remap plan:\n%s", out)
	}
	if _, _, v := mapping(); v != 1 || len(p.Emulator.Meters()) != 1 {
		t.Fatalf("the dry run wrote: version %d, %d meters", v, len(p.Emulator.Meters()))
	}
	step("remap", ExitOK, "mapping_version 2, create", "--event-name", "ev_calls_v2", "--yes")
	// Back to the first event name: Stripe holds an active meter for it, adopted.
	step("back plan", ExitOK, m1+" (adopted", "--event-name", "ev_calls")
	step("back", ExitOK, "feature api_calls → meter "+m1+" (event ev_calls, mapping_version 3, adopt)", "--event-name", "ev_calls", "--yes")

	count, err := p.Emulator.AddMeter(stripeemulator.MeterSpec{DisplayName: "n", EventName: "ev_count", Aggregation: stripeemulator.AggregationCount})
	if err != nil {
		t.Fatal(err)
	}
	step("count meter refused", ExitRefused, "meter_unusable: meter "+count.ID+" does not aggregate with sum", "--meter-id", count.ID, "--yes")
	if meter, event, v := mapping(); meter != m1 || event != "ev_calls" || v != 3 {
		t.Fatalf("mapping %s %s %d", meter, event, v)
	}
}
