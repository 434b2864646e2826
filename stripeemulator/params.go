package stripeemulator

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// checkParams refuses parameters the endpoint does not take, as Stripe does
// ("Received unknown parameter: x"). allowed holds exact names and
// "name[*]" for any nested key (payload[...], metadata[...], expand[...]).
func checkParams(form url.Values, allowed ...string) *apiError {
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !paramAllowed(k, allowed) {
			return invalidRequest(CodeParameterUnknown, k, "Received unknown parameter: %s", k)
		}
	}
	return nil
}

func paramAllowed(k string, allowed []string) bool {
	for _, a := range allowed {
		if a == k {
			return true
		}
		if base, ok := strings.CutSuffix(a, "[*]"); ok {
			if rest, ok := strings.CutPrefix(k, base+"["); ok && strings.HasSuffix(rest, "]") && len(rest) > 1 {
				return true
			}
		}
	}
	return false
}

// nested returns the values of name[key] as a map key → first value.
func nested(form url.Values, name string) map[string]string {
	out := map[string]string{}
	for k, v := range form {
		if rest, ok := strings.CutPrefix(k, name+"["); ok && strings.HasSuffix(rest, "]") && len(v) > 0 {
			out[strings.TrimSuffix(rest, "]")] = v[0]
		}
	}
	return out
}

// intParam parses an optional integer parameter.
func intParam(form url.Values, name string) (int64, bool, *apiError) {
	s := form.Get(name)
	if s == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, invalidRequest(CodeParameterInvalidInteger, name, "Invalid integer: %s", s)
	}
	return n, true, nil
}

// listParams are Stripe's list pagination parameters.
type listParams struct {
	limit         int
	startingAfter string
	endingBefore  string
}

// parseList reads limit (1..100, default 10), starting_after, ending_before.
func parseList(form url.Values) (listParams, *apiError) {
	lp := listParams{limit: 10, startingAfter: form.Get("starting_after"), endingBefore: form.Get("ending_before")}
	n, ok, ae := intParam(form, "limit")
	if ae != nil {
		return lp, ae
	}
	if ok {
		if n < 1 || n > 100 {
			return lp, invalidRequest(CodeParameterInvalidInteger, "limit", "This value must be greater than or equal to 1 and less than or equal to 100.")
		}
		lp.limit = int(n)
	}
	if lp.startingAfter != "" && lp.endingBefore != "" {
		return lp, invalidRequest(CodeParameterInvalid, "ending_before", "You may only specify one of these parameters: starting_after, ending_before.")
	}
	return lp, nil
}

// page cuts ids (in list order) by lp. ok is false when the cursor names no
// element.
func page(ids []string, lp listParams) (out []string, hasMore, ok bool) {
	start, end := 0, len(ids)
	if lp.startingAfter != "" {
		i := indexOf(ids, lp.startingAfter)
		if i < 0 {
			return nil, false, false
		}
		start = i + 1
	}
	if lp.endingBefore != "" {
		i := indexOf(ids, lp.endingBefore)
		if i < 0 {
			return nil, false, false
		}
		end = i
		if end-start > lp.limit {
			start = end - lp.limit
		}
		return ids[start:end], start > 0, true
	}
	if end-start > lp.limit {
		return ids[start : start+lp.limit], true, true
	}
	return ids[start:end], false, true
}

func indexOf(ids []string, id string) int {
	for i, v := range ids {
		if v == id {
			return i
		}
	}
	return -1
}

// listBody is Stripe's list envelope.
type listBody[T any] struct {
	Object  string `json:"object"`
	URL     string `json:"url"`
	HasMore bool   `json:"has_more"`
	Data    []T    `json:"data"`
}
