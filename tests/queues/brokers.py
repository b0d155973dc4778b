"""The brokers the queue tests start: acker_bench's (the bench starts the same ones)."""

from acker_bench.brokers import RabbitServer, RedisServer, free_port, running_rabbitmq, running_redis

__all__ = ["RabbitServer", "RedisServer", "free_port", "running_rabbitmq", "running_redis"]
