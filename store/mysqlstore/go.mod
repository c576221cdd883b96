module github.com/outbox-go/outbox/store/mysqlstore

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.2
	github.com/google/uuid v1.6.0
	github.com/outbox-go/outbox/internal/redact v0.0.0
	github.com/outbox-go/outbox/internal/tracing v0.0.0
	github.com/outbox-go/outbox/store/storedriver v0.0.0
	github.com/stretchr/testify v1.12.1
	go.opentelemetry.io/otel v1.44.0
	go.opentelemetry.io/otel/trace v1.44.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/metric v1.44.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/outbox-go/outbox/store/storedriver => ../storedriver

replace github.com/outbox-go/outbox/internal/redact => ../../internal/redact

replace github.com/outbox-go/outbox/internal/tracing => ../../internal/tracing
