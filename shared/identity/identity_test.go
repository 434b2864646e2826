package identity

import (
	"errors"
	"testing"
)

func TestKeyVector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tenant, kind, ref, account, want string
	}{
		{"org_123", "usage_window", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "acct_1Test",
			"77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc"},
	}
	for _, tt := range tests {
		got := Key(tt.tenant, SubjectKind(tt.kind), tt.ref, tt.account)
		if got != tt.want {
			t.Errorf("Key(%q,%q,%q,%q) = %s, want %s", tt.tenant, tt.kind, tt.ref, tt.account, got, tt.want)
		}
	}
}

func TestKeyIsInjective(t *testing.T) {
	t.Parallel()
	// Without length prefixes these two would concatenate to the same bytes.
	a := Key("ab", SubjectEvent, "c", "acct")
	b := Key("a", SubjectEvent, "bc", "acct")
	if a == b {
		t.Fatal("keys of different tuples collide")
	}
}

func TestKeyIgnoresExporterModeAndMappingVersion(t *testing.T) {
	t.Parallel()
	base := Identity{Tenant: "t", SubjectKind: SubjectEvent, SubjectRef: "event:1", Exporter: "stripe_meter_events", DestinationAccount: "acct_1", Mode: ModeTest, MappingVersion: 1}
	other := base
	other.MappingVersion = 2
	other.Mode = ModeLive
	other.Exporter = "x"
	if base.Key() != other.Key() {
		t.Fatal("key must depend only on tenant, subject kind, subject ref and destination account")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	valid := Identity{Tenant: "org_123", SubjectKind: SubjectUsageWindow, SubjectRef: "usage:api_calls:2026-09-01T00:00:00Z:0:5", Exporter: "stripe_meter_events", DestinationAccount: "acct_1Test", Mode: ModeTest}
	tests := []struct {
		name  string
		mut   func(*Identity)
		field string
	}{
		{"valid", func(*Identity) {}, ""},
		{"empty tenant", func(i *Identity) { i.Tenant = "" }, "tenant"},
		{"blank subject ref", func(i *Identity) { i.SubjectRef = "  " }, "subject_ref"},
		{"empty exporter", func(i *Identity) { i.Exporter = "" }, "exporter"},
		{"empty account", func(i *Identity) { i.DestinationAccount = "" }, "destination_account"},
		{"unknown kind", func(i *Identity) { i.SubjectKind = "invoice" }, "subject_kind"},
		{"bad mode", func(i *Identity) { i.Mode = "prod" }, "mode"},
		{"negative mapping version", func(i *Identity) { i.MappingVersion = -1 }, "mapping_version"},
		{"invalid utf8", func(i *Identity) { i.Tenant = "\xff" }, "tenant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := valid
			tt.mut(&id)
			err := id.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("got %v, want FieldError on %s", err, tt.field)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}
