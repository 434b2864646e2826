package stripeemulator

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

var summaryParams = []string{"customer", "start_time", "end_time", "value_grouping_window",
	"limit", "starting_after", "ending_before", "expand[*]"}

type summaryJSON struct {
	ID              string  `json:"id"`
	Object          string  `json:"object"`
	AggregatedValue float64 `json:"aggregated_value"`
	StartTime       int64   `json:"start_time"`
	EndTime         int64   `json:"end_time"`
	Livemode        bool    `json:"livemode"`
	Meter           string  `json:"meter"`
}

// Summary is one aggregated window, as answered by event_summaries.
type Summary struct {
	Start, End      time.Time // [Start, End)
	AggregatedValue float64
}

// handleSummaryList is GET /v1/billing/meters/{id}/event_summaries:
// customer, start_time (inclusive), end_time (exclusive), Unix seconds;
// value_grouping_window hour|day splits the range into aligned windows
// (start and end must align to the hour, resp. UTC midnight; without a
// window, to the minute), one summary per window, zeros included, in
// ascending start_time. Cancelled events are left out. Immediately
// consistent (Stripe's summaries lag).
func (e *Emulator) handleSummaryList(c *call) reply {
	if ae := checkParams(c.form, summaryParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	for _, p := range []string{"customer", "start_time", "end_time"} {
		if c.form.Get(p) == "" {
			return errReply(invalidRequest(CodeParameterMissing, p, "Missing required param: %s.", p), OutcomeInvalid)
		}
	}
	start, _, ae := intParam(c.form, "start_time")
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	end, _, ae := intParam(c.form, "end_time")
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	var step int64
	switch w := c.form.Get("value_grouping_window"); w {
	case "":
		step = 60
	case "hour":
		step = 3600
	case "day":
		step = 86400
	default:
		return errReply(invalidRequest(CodeParameterInvalid, "value_grouping_window", "Invalid value_grouping_window: must be one of day, hour"), OutcomeInvalid)
	}
	if start >= end {
		return errReply(invalidRequest(CodeParameterInvalid, "end_time", "end_time must be after start_time."), OutcomeInvalid)
	}
	if start%step != 0 || end%step != 0 {
		return errReply(invalidRequest(CodeParameterInvalid, "start_time", "start_time and end_time must be aligned to %d seconds for this value_grouping_window.", step), OutcomeInvalid)
	}
	if c.form.Get("value_grouping_window") == "" {
		step = end - start // one summary over the whole range
	}
	lp, ae := parseList(c.form)
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	meterID, cust := c.r.PathValue("id"), c.form.Get("customer")

	e.mu.Lock()
	m, ok := e.meters[meterID]
	if !ok {
		e.mu.Unlock()
		return errReply(notFound("id", "No such billing meter: '%s'", meterID), OutcomeInvalid)
	}
	if _, ok := e.customers[cust]; !ok {
		e.mu.Unlock()
		return errReply(invalidRequest(CodeResourceMissing, "customer", "No such customer: '%s'", cust), OutcomeInvalid)
	}
	buckets := map[int64]float64{}
	now := e.cfg.Now()
	for _, idx := range e.byPair[pairKey{meterID, cust}] {
		ev := e.events[idx]
		t := ev.Timestamp.Unix()
		if ev.Cancelled || t < start || t >= end || e.lagged(&ev, now) {
			continue
		}
		if m.Aggregation == AggregationCount {
			buckets[(t-start)/step]++
		} else {
			buckets[(t-start)/step] += ev.Value
		}
	}
	e.mu.Unlock()

	n := (end - start) / step
	first, last := int64(0), n // window indices [first, last)
	if lp.startingAfter != "" {
		i, ok := summaryIndex(lp.startingAfter, start, step, n)
		if !ok {
			return errReply(invalidRequest(CodeResourceMissing, "starting_after", "Invalid starting_after: no such summary in this range."), OutcomeInvalid)
		}
		first = i + 1
	}
	hasMore := false
	if lp.endingBefore != "" {
		i, ok := summaryIndex(lp.endingBefore, start, step, n)
		if !ok {
			return errReply(invalidRequest(CodeResourceMissing, "ending_before", "Invalid ending_before: no such summary in this range."), OutcomeInvalid)
		}
		last = i
		if last-first > int64(lp.limit) {
			first = last - int64(lp.limit)
		}
		hasMore = first > 0
	} else if last-first > int64(lp.limit) {
		last = first + int64(lp.limit)
		hasMore = true
	}
	body := listBody[summaryJSON]{Object: "list", URL: "/v1/billing/meters/" + meterID + "/event_summaries", HasMore: hasMore, Data: []summaryJSON{}}
	for i := first; i < last; i++ {
		ws := start + i*step
		body.Data = append(body.Data, summaryJSON{ID: "mtrusg_" + strconv.FormatInt(ws, 36) + "_" + strconv.FormatInt(step, 36),
			Object: "billing.meter_event_summary", AggregatedValue: buckets[i], StartTime: ws, EndTime: ws + step,
			Livemode: c.livemode, Meter: meterID})
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}

// summaryIndex decodes a summary id into its window index within the range.
func summaryIndex(id string, start, step, n int64) (int64, bool) {
	rest, ok := strings.CutPrefix(id, "mtrusg_")
	if !ok {
		return 0, false
	}
	a, b, ok := strings.Cut(rest, "_")
	if !ok {
		return 0, false
	}
	ws, err1 := strconv.ParseInt(a, 36, 64)
	st, err2 := strconv.ParseInt(b, 36, 64)
	if err1 != nil || err2 != nil || st != step || ws < start || (ws-start)%step != 0 {
		return 0, false
	}
	i := (ws - start) / step
	return i, i < n
}

// Summaries computes what event_summaries would answer for (event_name's
// meter, customer) over [start, end) with the given window (0: one summary
// for the whole range). An unknown event name or an empty range gives nil;
// an unknown customer gives zero windows.
func (e *Emulator) Summaries(eventName, customer string, start, end time.Time, window time.Duration) []Summary {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.meterForEvent(eventName)
	if m == nil || !end.After(start) {
		return nil
	}
	if window <= 0 {
		window = end.Sub(start)
	}
	var out []Summary
	for ws := start; ws.Before(end); ws = ws.Add(window) {
		out = append(out, Summary{Start: ws, End: ws.Add(window)})
	}
	for _, idx := range e.byPair[pairKey{m.ID, customer}] {
		ev := e.events[idx]
		if ev.Cancelled || ev.Timestamp.Before(start) || !ev.Timestamp.Before(end) || e.lagged(&ev, e.cfg.Now()) {
			continue
		}
		i := int(ev.Timestamp.Sub(start) / window)
		if m.Aggregation == AggregationCount {
			out[i].AggregatedValue++
		} else {
			out[i].AggregatedValue += ev.Value
		}
	}
	return out
}
