"""The acker wire contract shared by server and client: generated v1 modules, channel options, wire constants.

The server (:mod:`acker_service`) and the client (:mod:`acker_client`) both
depend on this package and never on each other, so an executor that only
sends acks needs neither the server nor its dependencies.
"""
