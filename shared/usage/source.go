package usage

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Source is where a feature's billed quantity comes from (seed 000, "Cutting
// a feature over from counting to recording"). It is deployment
// configuration (AURORA_FEATURE_SOURCES), never written by the cutover
// command: moving the watermark and changing the source are two decisions.
type Source string

const (
	// SourceCounters: the buffered era. The application increments
	// usage_counters and the buffered reporter stages windows. The default
	// for a feature that is not listed.
	SourceCounters Source = "counters"
	// SourceEvents: the recording era. The application records durable
	// events and corrections, each its own export item.
	SourceEvents Source = "events"
)

// Valid reports whether s is counters or events.
func (s Source) Valid() bool { return s == SourceCounters || s == SourceEvents }

// Sources maps feature → Source. A feature that is not listed counts
// (SourceCounters). The zero value (nil) is valid: every feature counts.
type Sources map[string]Source

// Of returns the source of feature (SourceCounters when not listed).
func (s Sources) Of(feature string) Source {
	if src, ok := s[feature]; ok {
		return src
	}
	return SourceCounters
}

// String renders s in the AURORA_FEATURE_SOURCES syntax, features sorted.
func (s Sources) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + string(s[k])
	}
	return strings.Join(parts, ",")
}

// ErrInvalidSources: AURORA_FEATURE_SOURCES is malformed; see ParseSources.
var ErrInvalidSources = errors.New("usage: invalid feature sources")

var featureName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)

// ParseSources parses the AURORA_FEATURE_SOURCES syntax: comma-separated
// feature:source pairs, e.g. "api_calls:events,egress_bytes:counters".
// Whitespace around items is ignored; an empty string is no entries. A
// feature is [A-Za-z0-9][A-Za-z0-9_.-]{0,99}; a source is counters|events; a
// feature listed twice is refused. Errors wrap ErrInvalidSources and name the
// offending item.
func ParseSources(s string) (Sources, error) {
	out := Sources{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		feature, src, found := strings.Cut(item, ":")
		feature, src = strings.TrimSpace(feature), strings.TrimSpace(src)
		switch {
		case !found:
			return nil, fmt.Errorf("%w: %q is not feature:source", ErrInvalidSources, item)
		case !featureName.MatchString(feature):
			return nil, fmt.Errorf("%w: %q is not a feature name", ErrInvalidSources, feature)
		case !Source(src).Valid():
			return nil, fmt.Errorf("%w: source %q of %s is not counters|events", ErrInvalidSources, src, feature)
		}
		if _, dup := out[feature]; dup {
			return nil, fmt.Errorf("%w: feature %s is listed twice", ErrInvalidSources, feature)
		}
		out[feature] = Source(src)
	}
	return out, nil
}
