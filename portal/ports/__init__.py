"""Web-app ports of running instances, each at its own host name on the lab domain.

The owner exposes a port (services.port_expose); the gateway then serves that port at
`<short id>-<port>.<lab domain>` (addresses.port_url) to the owner, and to whoever holds one of the share
links the owner made for it (services.share_create), until it is closed or the link revoked or expired.
docs/gateway.md, "Exposed ports", says how a browser is let in.
"""
