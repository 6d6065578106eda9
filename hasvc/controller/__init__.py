"""Controller mode: the controller process (``server``) and the client brokers use (``client``)."""
