package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// NewReadyGauge returns the gauge outbox_ready: 1 when ready returns nil, else 0, asked at
// each scrape. The outbox's processes pass the check their /readyz answers with, so an
// alert can tell a process that runs but cannot work (its database, Temporal, the search
// attributes or a broker sink) from one that is down (Prometheus's up).
func NewReadyGauge(ready func(context.Context) error) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outbox_ready",
		Help: "1 when the process is ready to work (its /readyz answers 200), else 0; checked at each scrape.",
	}, func() float64 {
		if ready(context.Background()) != nil {
			return 0
		}
		return 1
	})
}
