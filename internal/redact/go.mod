module github.com/outbox-go/outbox/internal/redact

go 1.26.0
