// Package deploy_test checks what deploy/ ships: the alert rules
// (prometheus/alerts.yml, its promtool unit tests), the Grafana dashboard,
// and their agreement with RUNBOOK.md; and, against a real Prometheus
// server, that the rules fire and clear on a running pipeline.
package deploy_test
