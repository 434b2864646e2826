package usage

import (
	"strconv"
	"strings"
	"time"
)

// WindowSubjectRef returns the subject_ref of a buffered usage window: the
// contract between the buffered reporter (which stages windows) and recovery
// (which abandons them). Seed 000, "Identity, and the key that makes retries
// safe":
//
//	usage:<feature>:<period start, RFC 3339 UTC>:<from>:<to>          generation 0
//	usage:<feature>:<period start, RFC 3339 UTC>:<from>:<to>:r<g>     generation g > 0
//
// from and to are the counter positions (units of the feature) the window
// covers; its quantity is to − from. generation is usage_windows.generation,
// which an operator's abandon increments (recovery.Abandon), so the same
// bounds restage under a new identity and a new idempotency key. A
// generation ≤ 0 adds no suffix.
//
//	WindowSubjectRef("api_calls", 2026-09-01T00:00:00Z, 0, 5, 0) = "usage:api_calls:2026-09-01T00:00:00Z:0:5"
//	WindowSubjectRef("api_calls", 2026-09-01T00:00:00Z, 0, 5, 1) = "usage:api_calls:2026-09-01T00:00:00Z:0:5:r1"
func WindowSubjectRef(feature string, periodStart time.Time, from, to int64, generation int) string {
	ref := windowPrefix(feature, periodStart) + strconv.FormatInt(from, 10) + ":" + strconv.FormatInt(to, 10)
	return WithGeneration(ref, generation)
}

// WithGeneration appends ":r<generation>" to ref when generation > 0 and
// returns ref unchanged otherwise. It is how an abandoned subject restages
// under a new identity: windows (WindowSubjectRef) and durable events
// ("event:<id>:r<g>", "correction:<id>:r<g>"; see EventGeneration).
func WithGeneration(ref string, generation int) string {
	if generation <= 0 {
		return ref
	}
	return ref + ":r" + strconv.Itoa(generation)
}

// WindowBounds parses a subject_ref made by WindowSubjectRef for feature and
// periodStart and returns its bounds and generation. ok is false when ref is
// not exactly such a reference (it is rebuilt and compared, so a feature that
// contains ':' cannot confuse it).
func WindowBounds(ref, feature string, periodStart time.Time) (from, to int64, generation int, ok bool) {
	rest, found := strings.CutPrefix(ref, windowPrefix(feature, periodStart))
	if !found {
		return 0, 0, 0, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, 0, 0, false
	}
	from, err1 := strconv.ParseInt(parts[0], 10, 64)
	to, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	if len(parts) == 3 {
		g, err := strconv.Atoi(strings.TrimPrefix(parts[2], "r"))
		if err != nil || g <= 0 || !strings.HasPrefix(parts[2], "r") {
			return 0, 0, 0, false
		}
		generation = g
	}
	if WindowSubjectRef(feature, periodStart, from, to, generation) != ref {
		return 0, 0, 0, false
	}
	return from, to, generation, true
}

// EventGeneration returns the generation of a durable event's item from its
// subject_ref: 0 for base ("event:<id>" or "correction:<id>", see SubjectRef),
// g for base + ":r<g>". ok is false when ref is neither.
func EventGeneration(ref, base string) (generation int, ok bool) {
	if ref == base {
		return 0, true
	}
	suffix, found := strings.CutPrefix(ref, base+":r")
	if !found {
		return 0, false
	}
	g, err := strconv.Atoi(suffix)
	if err != nil || g <= 0 || WithGeneration(base, g) != ref {
		return 0, false
	}
	return g, true
}

func windowPrefix(feature string, periodStart time.Time) string {
	return "usage:" + feature + ":" + periodStart.UTC().Format(time.RFC3339) + ":"
}
