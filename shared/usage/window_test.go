package usage_test

import (
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/usage"
)

func TestWindowSubjectRef(t *testing.T) {
	t.Parallel()
	sept := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		feature    string
		start      time.Time
		from, to   int64
		generation int
		want       string
	}{
		{"api_calls", sept, 0, 5, 0, "usage:api_calls:2026-09-01T00:00:00Z:0:5"},
		{"api_calls", sept, 0, 5, 1, "usage:api_calls:2026-09-01T00:00:00Z:0:5:r1"},
		{"api_calls", sept, 5, 12, 12, "usage:api_calls:2026-09-01T00:00:00Z:5:12:r12"},
		{"api_calls", sept, 0, 5, -1, "usage:api_calls:2026-09-01T00:00:00Z:0:5"},
		// a non-UTC period start is written in UTC
		{"api_calls", sept.In(time.FixedZone("x", 3600)), 0, 5, 0, "usage:api_calls:2026-09-01T00:00:00Z:0:5"},
	}
	for _, tt := range tests {
		got := usage.WindowSubjectRef(tt.feature, tt.start, tt.from, tt.to, tt.generation)
		if got != tt.want {
			t.Errorf("WindowSubjectRef(%q, %v, %d, %d, %d) = %q, want %q", tt.feature, tt.start, tt.from, tt.to, tt.generation, got, tt.want)
			continue
		}
		from, to, g, ok := usage.WindowBounds(got, tt.feature, tt.start)
		wantG := max(tt.generation, 0)
		if !ok || from != tt.from || to != tt.to || g != wantG {
			t.Errorf("WindowBounds(%q) = %d %d %d %v", got, from, to, g, ok)
		}
	}
}

func TestWindowBoundsRejectsOtherRefs(t *testing.T) {
	t.Parallel()
	sept := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	for _, ref := range []string{
		"usage:api_calls:2026-09-01T00:00:00Z:0",
		"usage:api_calls:2026-09-01T00:00:00Z:0:5:1",
		"usage:api_calls:2026-09-01T00:00:00Z:0:5:r0",
		"usage:api_calls:2026-09-01T00:00:00Z:0:5:r01",
		"usage:api_calls:2026-09-01T00:00:00Z:00:5",
		"usage:api_calls:2026-09-01T00:00:00Z:0:5:r1:r2",
		"usage:api_calls:2026-09-02T00:00:00Z:0:5",
		"usage:other:2026-09-01T00:00:00Z:0:5",
		"event:req-1",
	} {
		if _, _, _, ok := usage.WindowBounds(ref, "api_calls", sept); ok {
			t.Errorf("WindowBounds(%q) ok", ref)
		}
	}
}

func TestEventGeneration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ref, base string
		want      int
		ok        bool
	}{
		{"event:req-1", "event:req-1", 0, true},
		{"event:req-1:r1", "event:req-1", 1, true},
		{"event:req-1:r12", "event:req-1", 12, true},
		{"correction:c-1:r2", "correction:c-1", 2, true},
		{"event:req-1:r0", "event:req-1", 0, false},
		{"event:req-1:r01", "event:req-1", 0, false},
		{"event:req-1:rx", "event:req-1", 0, false},
		{"event:req-10", "event:req-1", 0, false},
	}
	for _, tt := range tests {
		g, ok := usage.EventGeneration(tt.ref, tt.base)
		if g != tt.want || ok != tt.ok {
			t.Errorf("EventGeneration(%q, %q) = %d %v, want %d %v", tt.ref, tt.base, g, ok, tt.want, tt.ok)
		}
		if ok && usage.WithGeneration(tt.base, g) != tt.ref {
			t.Errorf("WithGeneration(%q, %d) does not rebuild %q", tt.base, g, tt.ref)
		}
	}
}
