package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/codec"
)

func newCodecServerCmd(g *globals) *cobra.Command {
	var (
		addr    string
		origins []string
	)
	cmd := &cobra.Command{
		Use:   "codec-server",
		Short: "Serve the payload codec to the Temporal Web UI and CLI (/encode, /decode)",
		Long: `Serves the configured payload codec (codec: in the config, or OUTBOX_CODEC_KEY)
over HTTP, so the Temporal Web UI shows decrypted payloads and failure messages: set the
UI's codec endpoint (Settings, or TEMPORAL_CODEC_ENDPOINT of the UI server) to the printed
URL, or pass it to the Temporal CLI with --codec-endpoint.

It answers POST /encode and POST /decode with JSON payloads, and allows cross-origin
requests from the --origin values only. It listens on loopback by default: anyone who can
reach it can decrypt, so put it behind authentication before exposing it.`,
		Example: `  outbox codec-server --config outbox.yaml
  OUTBOX_CODEC_KEY=$(cat key.b64) outbox codec-server --addr 127.0.0.1:8081 --origin http://127.0.0.1:8233`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := g.logger()
			if err != nil {
				return err
			}
			cfg, err := g.config()
			if err != nil {
				return err
			}
			c, err := cfg.Codec.New()
			if err != nil {
				return &app.ConfigError{Err: fmt.Errorf("invalid config:\n%w", err)}
			}
			if c == nil {
				return &app.ConfigError{Err: errors.New("no codec configured: set codec.keys in the config, or OUTBOX_CODEC_KEY (base64 of 32 bytes)")}
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("codec server: listen on --addr %s: %w", addr, err)
			}
			srv := &http.Server{Handler: codec.NewHTTPHandler(c, origins...), ReadHeaderTimeout: 10 * time.Second}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			fmt.Fprintf(cmd.OutOrStdout(), "codec server on http://%s (active key %s, origins %v)\n", ln.Addr(), c.ActiveKeyID(), origins)
			logger.InfoContext(cmd.Context(), "Codec server started", "address", ln.Addr().String(), "active_key_id", c.ActiveKeyID(), "key_ids", c.KeyIDs())
			select {
			case <-cmd.Context().Done():
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
				defer cancel()
				err := srv.Shutdown(ctx)
				logger.InfoContext(ctx, "Codec server stopped")
				return err
			case err := <-done:
				return fmt.Errorf("codec server: %w", err)
			}
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8081", "listen `address`")
	cmd.Flags().StringArrayVar(&origins, "origin", []string{"http://127.0.0.1:8233"}, "browser `origin` allowed to call it, the Temporal UI's (repeatable)")
	return cmd
}
