package cli

import (
	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// Databases are the databases besides PostgreSQL the command runs on.
var Databases = map[string]app.DatabaseOpener{config.DatabaseMySQL: mysqlstore.OpenDatabase}
