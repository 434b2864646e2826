package inbox

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/stripe/stripe-go/v76/webhook"
)

// Fuzz targets of the webhook's two readers of outside input: the envelope
// and the Stripe-Signature header (go test -fuzz '^FuzzReadEnvelope$'
// ./inbox). Seeds: testdata/seed (copied from the shared data folder, see
// testdata/seed/SOURCES.md); regressions in testdata/fuzz/<target>/.

// seedBodies returns the seed envelopes: every seed file, and each line of
// the JSONL ones.
func seedBodies(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob("testdata/seed/*.json*")
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed envelopes (%v)", err)
	}
	var out [][]byte
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		if strings.HasSuffix(name, ".jsonl") {
			for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
				out = append(out, l)
			}
			continue
		}
		out = append(out, data)
	}
	return append(out,
		[]byte(`{"id":"evt_\u0000b","type":"invoice.paid","created":1700000000}`),
		[]byte(`{"id":"evt_1","created":"2026-09-01T10:00:00.5Z","data":{"object":{"customer":{"id":"cus_1"}}}}`),
		[]byte(`{"id":"evt_1","created":99999999999999}`))
}

// FuzzReadEnvelope: any verified body. readEnvelope either refuses it with
// ErrNoEventID (400) or an *EnvelopeError wrapping ErrUnstorable (422), or
// returns fields Postgres can store: texts that pass field.Text, a created
// time inside timestamptz's range and the body verbatim. Storable is what
// keeps a verified event from being answered 503 forever.
func FuzzReadEnvelope(f *testing.F) {
	for _, b := range seedBodies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec, err := readEnvelope(body)
		if err != nil {
			var ee *EnvelopeError
			switch {
			case errors.Is(err, ErrNoEventID):
			case errors.As(err, &ee) && errors.Is(err, ErrUnstorable):
				if ee.Field == "" || ee.Reason == "" {
					t.Fatalf("envelope error without field or reason: %v", err)
				}
			default:
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if r := field.Text(rec.EventID, field.MaxStripeIDBytes); r != "" {
			t.Fatalf("accepted id: %s", r)
		}
		for _, s := range []string{rec.Type, rec.APIVersion, rec.Customer} {
			if r := field.OptionalText(s, field.MaxStripeIDBytes); r != "" {
				t.Fatalf("accepted %q: %s", s, r)
			}
		}
		if rec.Created != nil && (rec.Created.Year() < 1970 || rec.Created.Year() > 9999 || rec.Created.Location() != time.UTC) {
			t.Fatalf("accepted created %v: outside what the inbox stores", rec.Created)
		}
		if !bytes.Equal(rec.Payload, body) {
			t.Fatal("payload is not the body verbatim")
		}
	})
}

// FuzzSignatureHeader: any header over any body. The handler accepts the
// signature only when the header holds v1=HMAC-SHA256(secret, t.body) for
// the very timestamp t its own tolerance checks read, within 300 s of now
// either way; a header built the way Stripe builds it is always accepted.
//
// stripe-go checks the past tolerance against the real clock, so the
// header is a template: NOW becomes the current Unix time and SIG the
// correct signature of NOW.body, which keeps the accepting paths reachable
// however long the fuzzer runs.
func FuzzSignatureHeader(f *testing.F) {
	sign := func(ts int64, body []byte) string {
		mac := hmac.New(sha256.New, []byte(testSecret))
		mac.Write([]byte(strconv.FormatInt(ts, 10) + "." + string(body)))
		return hex.EncodeToString(mac.Sum(nil))
	}
	for i, b := range seedBodies(f) {
		switch i % 4 {
		case 0:
			f.Add("t=NOW,v1=SIG", b)
		case 1:
			f.Add("t=NOW,v1=SIG,v0=ab", b)
		case 2:
			f.Add("v1=00,t=NOW,v1=SIG", b)
		default:
			f.Add("t=NOW,v1=SIG,t=NOW0", b)
		}
	}
	f.Add("", []byte(`{}`))
	f.Add("t=,v1=", []byte(`{"id":"evt_1"}`))
	f.Add("t=1,t=NOW,v1=SIG", []byte(`{"id":"evt_1"}`))
	h := &Handler{secrets: []string{"whsec_other", testSecret}, now: time.Now}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		now := time.Now()
		header = strings.ReplaceAll(header, "NOW", strconv.FormatInt(now.Unix(), 10))
		header = strings.ReplaceAll(header, "SIG", sign(now.Unix(), body))
		_, err := h.verify(body, header)
		var ee *EnvelopeError
		if err == nil || errors.As(err, &ee) || errors.Is(err, ErrNoEventID) { // the signature was accepted
			ts, ok := signatureTimestamp(header)
			if !ok {
				t.Fatalf("accepted a header without a timestamp: %q", header)
			}
			if d := ts.Sub(now); d > FutureTolerance+time.Second || d < -SignatureTolerance-5*time.Second {
				t.Fatalf("accepted timestamp %v, %v from now", ts, d)
			}
			if !strings.Contains(header, "v1="+sign(ts.Unix(), body)) {
				t.Fatalf("accepted %q: no v1 signature over the timestamp checked (%d)", header, ts.Unix())
			}
		}
		if ts, ok := signatureTimestamp(header); ok && ts.Sub(now) < FutureTolerance && now.Sub(ts) < SignatureTolerance-5*time.Second {
			good := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: ts})
			if _, err := h.verify(body, good.Header); err != nil && !errors.As(err, &ee) && !errors.Is(err, ErrNoEventID) {
				t.Fatalf("a header built like Stripe's refused: %v", err)
			}
		}
	})
}
