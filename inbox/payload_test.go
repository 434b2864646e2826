package inbox

import (
	"errors"
	"os"
	"testing"
)

func TestParseEventBothInvoiceLayouts(t *testing.T) {
	t.Parallel()
	legacy, err := parseEvent(invoice(t, legacyInvoice, "invoice.paid", "evt_1", t0, "cus_1", "in_1", "sub_1"))
	if err != nil || legacy.Invoice.SubscriptionID != "sub_1" || legacy.Customer != "cus_1" || legacy.Invoice.Outcome != invoicePaid {
		t.Fatalf("legacy %+v %v", legacy, err)
	}
	basil, err := parseEvent(invoice(t, basilInvoice, "invoice.payment_failed", "evt_2", t0, "cus_1", "in_1", "sub_1"))
	if err != nil || basil.Invoice.SubscriptionID != "sub_1" || basil.Invoice.Outcome != invoiceFailed || basil.APIVersion != "2025-03-31.basil" {
		t.Fatalf("basil %+v %v", basil, err)
	}
}

func TestParseRealFixtures(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"checkout.session.completed", "customer.subscription.created", "customer.subscription.updated",
		"customer.subscription.deleted", "invoice.paid", "invoice.payment_failed"} {
		b, err := os.ReadFile("testdata/ruby-mock." + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		ev, err := parseEvent(b)
		if err != nil || ev.Type != name || ev.Customer != "cus_00000000000000" {
			t.Errorf("%s: %+v %v", name, ev, err)
		}
	}
}

func TestParseEventErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, field string
	}{
		{"not json", `nope`, "$"},
		{"no id", `{"object":"event","type":"x","created":1}`, "id"},
		{"not an event", `{"id":"evt","object":"invoice","type":"x","created":1}`, "object"},
		{"no type", `{"id":"evt","created":1}`, "type"},
		{"no created", `{"id":"evt","type":"x"}`, "created"},
		{"no data", `{"id":"evt","type":"invoice.paid","created":1}`, "data"},
		{"object not an object", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":"x"}}`, "data.object"},
		{"invoice customer missing", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1"}}}`, "data.object.customer"},
		{"invoice contradictory", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1","customer":"c","subscription":"sub_a","parent":{"subscription_details":{"subscription":"sub_b"}}}}}`, "data.object.subscription"},
		{"subscription bad status", `{"id":"evt","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub_1","customer":"c","status":"weird"}}}`, "data.object.status"},
		{"subscription price number", `{"id":"evt","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub_1","customer":"c","status":"active","items":{"data":[{"price":7}]}}}}`, "data.object.items.data[0].price"},
		{"checkout tenant contradiction", `{"id":"evt","type":"checkout.session.completed","created":1,"data":{"object":{"id":"cs_1","customer":"c","client_reference_id":"t1","metadata":{"aurora_tenant":"t2"}}}}`, "data.object.client_reference_id"},
		{"checkout tenant control char", `{"id":"evt","type":"checkout.session.completed","created":1,"data":{"object":{"id":"cs_1","customer":"c","client_reference_id":"t\u0001"}}}`, "data.object.client_reference_id"},
		{"NUL in the invoice id", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_\u0000","customer":"c"}}}`, "data.object.id"},
		{"NUL in an expanded subscription", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1","customer":"c","subscription":{"id":"sub_\u0000"}}}}`, "data.object.subscription"},
		{"NUL in the parent's subscription", `{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1","customer":"c","parent":{"subscription_details":{"subscription":"sub_\u0000"}}}}}`, "data.object.parent.subscription_details.subscription"},
		{"NUL in the subscription id", `{"id":"evt","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub_\u0000","customer":"c","status":"active"}}}`, "data.object.id"},
		{"NUL in a price id", `{"id":"evt","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub_1","customer":"c","status":"active","items":{"data":[{"price":{"id":"price_\u0000"}}]}}}}`, "data.object.items.data[0].price"},
		{"invalid UTF-8 in a customer", "{\"id\":\"evt\",\"type\":\"invoice.paid\",\"created\":1,\"data\":{\"object\":{\"id\":\"in_1\",\"customer\":\"cus_\xff\"}}}", "data.object.customer"},
		{"checkout metadata empty", `{"id":"evt","type":"checkout.session.completed","created":1,"data":{"object":{"id":"cs_1","customer":"c","metadata":{"aurora_tenant":""}}}}`, "data.object.metadata.aurora_tenant"},
	}
	for _, tc := range tests {
		_, err := parseEvent([]byte(tc.body))
		var pe *PayloadError
		if !errors.Is(err, ErrUnrecognizedPayload) || !errors.As(err, &pe) || pe.Field != tc.field {
			t.Errorf("%s: %v, want field %s", tc.name, err, tc.field)
		}
	}
	// an expanded customer object is an id
	ev, err := parseEvent([]byte(`{"id":"evt","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1","customer":{"id":"cus_9","object":"customer"},"subscription":{"id":"sub_9"}}}}`))
	if err != nil || ev.Customer != "cus_9" || ev.Invoice.SubscriptionID != "sub_9" {
		t.Fatalf("expanded: %+v %v", ev, err)
	}
	// tenant from metadata when client_reference_id is empty
	ev, err = parseEvent([]byte(`{"id":"evt","type":"checkout.session.completed","created":1,"data":{"object":{"id":"cs_1","customer":"c","client_reference_id":null,"metadata":{"aurora_tenant":"t2"}}}}`))
	if err != nil || ev.Checkout.Tenant != "t2" {
		t.Fatalf("metadata tenant: %+v %v", ev, err)
	}
}
