"""Clients for services: a consumer that prefetches, acknowledges in batches and renews its
leases, and a publisher that batches sends, both over a queue table or its broker.
"""
