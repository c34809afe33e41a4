"""`devcloud`: the command-line tool for the DevCloud API. It talks HTTP (httpx) to a portal with a
personal access token and never imports Django, so it runs anywhere the package is installed."""
