package config

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
)

// Var is one variable a configuration struct reads, as loaded.
type Var struct {
	Name    string // e.g. "AURORA_RELAY_WORKERS"
	Value   string // as loaded; secrets are "(set)" or "(unset)", URLs redacted
	Default string // the envDefault, "" when none
	Set     bool   // set (non-empty) in the environment; otherwise the default applies
}

// Vars lists the variables cfg (a struct or a pointer to one, with env
// tags as config.Load reads them) reads, in field order, with the values
// cfg holds. Nested structs are walked as caarlos0/env walks them
// (envPrefix included).
func Vars(cfg any) []Var {
	v := reflect.ValueOf(cfg)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v = reflect.New(v.Type().Elem()).Elem()
			break
		}
		v = v.Elem()
	}
	var out []Var
	walkVars(v, Prefix, &out)
	return out
}

// Names returns the names Vars lists, sorted.
func Names(cfg any) []string {
	vars := Vars(cfg)
	out := make([]string, len(vars))
	for i, v := range vars {
		out[i] = v.Name
	}
	sort.Strings(out)
	return out
}

func walkVars(v reflect.Value, prefix string, out *[]Var) {
	if v.Kind() != reflect.Struct {
		return
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		fv := v.Field(i)
		if tag == "" {
			if f.Type.Kind() == reflect.Struct {
				walkVars(fv, prefix+f.Tag.Get("envPrefix"), out)
			}
			continue
		}
		if tag == "-" { // a field that is not a variable (set by the program)
			continue
		}
		name := prefix + tag
		val, set := os.LookupEnv(name)
		*out = append(*out, Var{Name: name, Value: shown(name, fv, val != ""), Default: f.Tag.Get("envDefault"), Set: set && val != ""})
	}
}

// secretName reports whether a variable holds a secret, by its name.
func secretName(name string) bool {
	for _, s := range []string{"KEY", "SECRET", "PASSWORD", "TOKEN"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func shown(name string, v reflect.Value, set bool) string {
	if secretName(name) {
		if set || !v.IsZero() {
			return "(set)"
		}
		return "(unset)"
	}
	s := fmt.Sprint(v.Interface())
	if strings.Contains(name, "URL") || strings.HasSuffix(name, "_API_BASE") {
		if s == "" {
			return s
		}
		return RedactURL(s)
	}
	return s
}

// Unknown is an AURORA_* variable in the environment that no aurora
// component reads.
type Unknown struct {
	Name    string // as set, e.g. "AURORA_RELAY_WORKRS"
	Closest string // the known variable nearest to it (edit distance)
}

// UnknownVars returns the AURORA_* variables of environ ("NAME=value"
// entries, as os.Environ returns them) that are not in known, sorted by
// name, each with the closest known name. Values are never looked at.
func UnknownVars(environ []string, known []string) []Unknown {
	isKnown := make(map[string]bool, len(known))
	for _, k := range known {
		isKnown[k] = true
	}
	var out []Unknown
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix) || isKnown[name] {
			continue
		}
		out = append(out, Unknown{Name: name, Closest: Closest(name, known)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Closest returns the name of candidates nearest to name by edit distance
// (Levenshtein, over bytes), the first such in sorted order on a tie; ""
// when there are no candidates.
func Closest(name string, candidates []string) string {
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestD := "", -1
	for _, c := range sorted {
		if d := editDistance(name, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
