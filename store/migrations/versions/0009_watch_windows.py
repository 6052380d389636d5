"""Add watch_windows: the windows of a watched deployment, their figures and verdicts.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "watch_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("verdict", sa.String(40), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_watch_windows"),
    )
    op.create_index("ix_watch_windows_deployment_ended_at", "watch_windows", ["deployment", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_watch_windows_deployment_ended_at", table_name="watch_windows")
    op.drop_table("watch_windows")
