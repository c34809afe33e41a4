"""The SSH jump gateway: `ssh -J <portal>:<port> developer@<instance>` reaches the sshd inside the
person's own running instance. See server.py for the process, access.py for who may go where."""
