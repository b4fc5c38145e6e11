//! Sans-IO pieces around a connection: handshake, reconnect backoff, keepalive, URL mapping.
