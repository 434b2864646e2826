package demo

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// The demo on testdata/hostile.jsonl (good lines mixed with a NUL tenant, a
// 300-character tenant, two tenants differing only in invalid UTF-8 bytes,
// trailing garbage, a 19-digit and a negative quantity, an id reused with
// other content, a correction of an unknown event): the run succeeds, each
// good line is applied exactly once (applied = committed), each bad line is
// counted with its line number and reason, and nothing is sent for them
// (no customer, no meter event).
func TestDemoHostileJSONL(t *testing.T) {
	t.Parallel()
	o := testOptions(t)
	o.Input = "testdata/hostile.jsonl"
	o.RebaseTime = true
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	assertBalanced(t, s)
	var malformed []int
	for _, m := range s.FirstMalformed {
		if m.Reason == "" {
			t.Errorf("line %d: no reason", m.Line)
		}
		malformed = append(malformed, m.Line)
	}
	if want := []int{2, 3, 4, 5, 7, 8, 9, 10, 11, 15}; s.MalformedLines != len(want) || !slices.Equal(malformed, want) {
		t.Fatalf("malformed %d lines %v, want %v", s.MalformedLines, malformed, want)
	}
	if s.RejectedEvents != 2 || len(s.FirstRejected) != 2 ||
		s.FirstRejected[0].Line != 13 || !strings.Contains(s.FirstRejected[0].Reason, "event_conflict") ||
		s.FirstRejected[1].Line != 14 || !strings.Contains(s.FirstRejected[1].Reason, "corrected_event_unknown") {
		t.Fatalf("rejected %d %+v", s.RejectedEvents, s.FirstRejected)
	}
	if s.ItemsStaged != 4 || s.ItemsByState["accepted"]+s.ItemsByState["confirmed"] != 4 {
		t.Fatalf("items %d %+v, want the 4 good lines accepted", s.ItemsStaged, s.ItemsByState)
	}
	if s.CommittedQuantity["api_calls"] != 3+999_999_999_999_999+7 || s.CommittedQuantity["egress_bytes"] != 5 {
		t.Fatalf("committed %v", s.CommittedQuantity)
	}
	// Set-up calls: 2 meters and the 3 good tenants' customers; 4 events.
	if s.ProviderRequests["applied"] != 4 || s.ProviderRequests["ok"] != 5 || s.Tenants != 3 {
		t.Fatalf("provider requests %v, tenants %d", s.ProviderRequests, s.Tenants)
	}
}
