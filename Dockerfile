# One image for every Plumb process; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PLUMB_VAR_DIR=/var/lib/plumb
WORKDIR /app

COPY pyproject.toml ./
RUN pip install --no-cache-dir --disable-pip-version-check . \
    && useradd --system --home /app plumb \
    && mkdir -p /var/lib/plumb && chown plumb /var/lib/plumb

COPY . .
RUN rm -rf build plumb.egg-info
USER plumb
EXPOSE 8000 5555
CMD ["gunicorn", "config.asgi:application", "--worker-class", "asgi", "--bind", "0.0.0.0:8000"]
