"""What tokenyard's services share: message schemas, subjects, codecs, the NATS helpers,
telemetry and configuration. A service imports from here, never from another service."""
