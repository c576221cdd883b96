package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the outbox version; a release build sets it with
// -ldflags "-X github.com/outbox-go/outbox/cmd/outbox/internal/cli.version=v1.2.3".
// Without it, the version is the one Go recorded for the main module (v1.2.3 for
// go install ...@v1.2.3, "(devel)" for a build from a checkout).
var version string

// BuildInfo is what outbox version prints.
type BuildInfo struct {
	Version   string `json:"version"`               // the outbox version, "(devel)" for a build from a checkout
	Module    string `json:"module"`                // the main module, the command's
	Library   string `json:"library,omitempty"`     // the version of the library module the command was built with
	Commit    string `json:"commit,omitempty"`      // the VCS revision the binary was built from
	Time      string `json:"commit_time,omitempty"` // its commit time
	Modified  bool   `json:"modified,omitempty"`    // the checkout had uncommitted changes
	GoVersion string `json:"go"`                    // the Go toolchain that built it
	Platform  string `json:"platform"`              // GOOS/GOARCH
}

const libraryModule = "github.com/outbox-go/outbox"

// ReadBuildInfo returns the running binary's version, commit and Go version.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{Version: version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		if b.Version == "" {
			b.Version = "(unknown)"
		}
		return b
	}
	b.Module = info.Main.Path
	if b.Version == "" {
		b.Version = info.Main.Version
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if info.Main.Path == libraryModule {
		b.Library = info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == libraryModule {
			b.Library = d.Version
			if d.Replace != nil {
				b.Library = d.Replace.Path
				if d.Replace.Version != "" {
					b.Library = d.Replace.Version
				}
			}
		}
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one line --version prints.
func (b BuildInfo) String() string {
	s := "outbox " + b.Version
	if b.Commit != "" {
		s += " (commit " + short(b.Commit)
		if b.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + " " + b.GoVersion + " " + b.Platform
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

func (b BuildInfo) write(w io.Writer) {
	fmt.Fprintf(w, "version  %s\n", b.Version)
	if b.Module != "" {
		fmt.Fprintf(w, "module   %s\n", b.Module)
	}
	if b.Library != "" {
		fmt.Fprintf(w, "library  %s %s\n", libraryModule, b.Library)
	}
	if b.Commit != "" {
		c := b.Commit
		if b.Time != "" {
			c += " " + b.Time
		}
		if b.Modified {
			c += " (with uncommitted changes)"
		}
		fmt.Fprintf(w, "commit   %s\n", c)
	} else {
		fmt.Fprintf(w, "commit   unknown (built without VCS information: go run, go test and -buildvcs=false record none)\n")
	}
	fmt.Fprintf(w, "go       %s %s\n", b.GoVersion, b.Platform)
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the outbox version, the commit it was built from and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := ReadBuildInfo()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			b.write(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
