package reconcilertest

import "github.com/aurora-billing/aurora/stripeemulator"

func stripemeter(name string) stripeemulator.MeterSpec {
	return stripeemulator.MeterSpec{DisplayName: name, EventName: "aurora_" + name}
}
