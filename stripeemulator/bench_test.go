package stripeemulator_test

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
)

// benchEmulator returns an emulator with 100 customers and the api_calls
// meter, on the real clock.
func benchEmulator(b *testing.B, cfg stripeemulator.Config) (*stripeemulator.Emulator, []string) {
	b.Helper()
	emu, err := stripeemulator.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var customers []string
	for i := range 100 {
		c := "cus_bench" + itoa(int64(i))
		if err := emu.AddCustomer(c); err != nil {
			b.Fatal(err)
		}
		customers = append(customers, c)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: eventName}); err != nil {
		b.Fatal(err)
	}
	return emu, customers
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// BenchmarkMeterEventServeHTTP measures the handler alone (no network):
// one applied meter event per op, 64-hex identifiers as the deliverer
// sends, spread over 100 customers. retained-B/event is the heap the
// emulator keeps per applied event (event record, dedupe and idempotency
// entries, saved response, request record).
func BenchmarkMeterEventServeHTTP(b *testing.B) {
	emu, customers := benchEmulator(b, stripeemulator.Config{})
	now := time.Now()
	before := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := strings.Repeat("0", 56) + itoa(int64(10_000_000+i))
		form := eventForm(id, customers[i%len(customers)], "1", now)
		req := httptest.NewRequest(http.MethodPost, "/v1/billing/meter_events", strings.NewReader(form.Encode()))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", id)
		rec := httptest.NewRecorder()
		emu.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	b.StopTimer()
	after := heapInUse()
	if after > before {
		b.ReportMetric(float64(after-before)/float64(b.N), "retained-B/event")
	}
	runtime.KeepAlive(emu)
}

// BenchmarkMeterEventHTTP measures stripe-go over loopback HTTP against
// the emulator, in parallel, 100 customers (each goroutine picks customers
// round-robin; the per-(customer, meter) limiter answers 429 to overlaps,
// which are retried and counted as overlaps-per-op).
func BenchmarkMeterEventHTTP(b *testing.B) {
	emu, customers := benchEmulator(b, stripeemulator.Config{})
	srv := httptest.NewServer(emu)
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	sc := stripeClient(srv.URL, testKey, hc)
	now := time.Now()
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := seq.Add(1)
			id := "bench-" + itoa(n)
			for {
				_, err := sc.BillingMeterEvents.New(event(id, customers[int(n)%len(customers)], "1", now))
				if err == nil {
					break
				}
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(emu.Overlaps())/float64(b.N), "overlaps/op")
	if d := emu.DuplicateApplications(); len(d) != 0 {
		b.Fatalf("duplicates %v", d)
	}
}
