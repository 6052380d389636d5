"""Add endpoint_requests: every request an endpoint session sent to a running deployment, as measured.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "endpoint_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("request_index", sa.Integer(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("itl_s", sa.JSON(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("tpot_s", sa.Float(), nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("error_kind", sa.String(32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("draft_n", sa.Integer(), nullable=True),
        sa.Column("draft_n_accepted", sa.Integer(), nullable=True),
        sa.Column("verify_calls", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_endpoint_requests"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_endpoint_requests_session_id_sessions", ondelete="CASCADE"
        ),
    )
    op.create_index(
        "ix_endpoint_requests_session_id_endpoint_concurrency",
        "endpoint_requests",
        ["session_id", "endpoint", "concurrency"],
    )


def downgrade() -> None:
    op.drop_index("ix_endpoint_requests_session_id_endpoint_concurrency", table_name="endpoint_requests")
    op.drop_table("endpoint_requests")
