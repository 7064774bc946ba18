"""flightrec: a logging reverse proxy for OpenAI-compatible APIs."""
