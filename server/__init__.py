"""lookahead.server: an OpenAI-compatible HTTP server with Predicted Outputs (`lookahead serve`)."""
