package demo

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/demo/feed"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/usage"
)

// BenchmarkRecordAccessLog measures staging the shared access log (19,331
// usage events) through the cutover gate with the demo's writers.
func BenchmarkRecordAccessLog(b *testing.B) {
	f, err := os.Open("../../shared/data/access-logs/elastic-apache_logs.log")
	if err != nil {
		b.Fatal(err)
	}
	res, err := feed.Read(f, feed.FormatAccessLog, "apache")
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	res.Rebase(time.Now())
	gate := usage.Gate{Recorder: usage.Recorder{DestinationAccount: "acct_1", Mode: "test"},
		Sources: usage.Sources{feed.FeatureAPICalls: usage.SourceEvents, feed.FeatureEgressBytes: usage.SourceEvents}}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		pool := dbtest.New(b)
		b.StartTimer()
		if _, err := record(context.Background(), pool, gate, res.Events, res.EventLines); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(res.Events)*b.N)/b.Elapsed().Seconds(), "events/s")
}
